"""export-hf's default task (from transformers' auto mappings, an error for an architecture
made for a task it does not serve) and the runtime's image processor configuration
written from transformers' image processor."""

from __future__ import annotations

import re

import pytest
import torch

from fx2onnx.hub.loading import default_task
from fx2onnx.hub.tasks import UnsupportedTaskError
from fx2onnx.hub.vision_language.architectures import ARCHITECTURES

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(("architecture", "task"), [
    ("Qwen2_5_VLForConditionalGeneration", "image-text-to-text"),
    ("Gemma3ForConditionalGeneration", "image-text-to-text"),  # filed under causal LMs too: the image task wins
    ("LlamaForCausalLM", "text-generation"),
    ("ViTForImageClassification", "image-classification"),
    ("BertModel", "feature-extraction"),
    ("BertForSequenceClassification", "text-classification"),
    ("DistilBertForTokenClassification", "token-classification"),
    ("RobertaForQuestionAnswering", "question-answering"),
    ("BertForMaskedLM", "fill-mask"),
    ("BertForMultipleChoice", "multiple-choice"),
    ("DetrForObjectDetection", "object-detection"),
    ("SegformerForSemanticSegmentation", "image-segmentation"),
    ("Mask2FormerForUniversalSegmentation", "image-segmentation"),
    ("DPTForDepthEstimation", "depth-estimation"),
    ("Wav2Vec2ForCTC", "automatic-speech-recognition"),
    ("ASTForAudioClassification", "audio-classification"),
    ("CLIPModel", "zero-shot-image-classification"),
    ("XLMWithLMHeadModel", "text-generation"),  # filed under fill-mask too: a generation model stays one
    ("Mistral4ForCausalLM", "text-generation"),  # filed under image-text-to-text alone, with no encoder
    ("VitsModel", "text-to-audio"),
    ("SpeechT5ForTextToSpeech", "text-to-audio"),  # a spectrogram model and its vocoder
])
def test_the_default_task_is_the_one_transformers_files_the_architecture_under(architecture, task):
    assert default_task(transformers.PretrainedConfig(architectures=[architecture])) == task


def test_a_causal_lm_with_an_encoder_filed_under_image_text_to_text_stays_there():
    config = transformers.PretrainedConfig(architectures=["GitForCausalLM"], vision_config={"hidden_size": 32})
    assert default_task(config) == "image-text-to-text"


@pytest.mark.parametrize(("architecture", "task"), [
    ("MoonshineForConditionalGeneration", "automatic-speech-recognition"),  # no mel bins: its class says it
    ("T5ForConditionalGeneration", "text2text-generation"),
])
def test_an_encoder_decoder_is_speech_recognition_where_transformers_files_it_so(architecture, task):
    assert default_task(transformers.PretrainedConfig(architectures=[architecture], is_encoder_decoder=True)) == task


@pytest.mark.parametrize(("architecture", "needed"), [
    ("VivitForVideoClassification", "video-classification"),
    ("OwlViTForObjectDetection", "zero-shot-object-detection"),
])
def test_an_architecture_for_a_task_not_served_is_an_error_naming_it(architecture, needed):
    with pytest.raises(UnsupportedTaskError, match=re.escape(f"is a model for {needed}, which export-hf does not serve")) as error:
        default_task(transformers.PretrainedConfig(architectures=[architecture]))
    assert str(error.value).startswith(architecture) and "image-text-to-text" in str(error.value)


def test_the_runtime_processor_does_what_the_image_processor_does():
    config = transformers.Qwen2_5_VLConfig()
    qwen_processor_config = ARCHITECTURES["qwen2_5_vl"].processor_config
    image_processor = transformers.Qwen2VLImageProcessorPil(image_mean=[0.5, 0.4, 0.3], image_std=[0.2, 0.25, 0.3])
    transforms = qwen_processor_config(image_processor, config)["processor"]["transforms"]
    operations = {t["operation"]["type"]: t["operation"].get("attrs", {}) for t in transforms}
    assert list(operations) == ["DecodeImage", "ConvertRGB", "Resize", "Rescale", "Normalize", "PatchImage"]
    # each image resized as transformers' smart_resize does, within the processor's pixel bounds
    assert operations["Resize"] == {"smart_resize": 1, "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280,
                                    "keep_aspect_ratio": 0, "interpolation": "CUBIC", "patch_size": 14, "merge_size": 2}
    assert operations["Rescale"]["rescale_factor"] == pytest.approx(1 / 255)
    assert operations["Normalize"] == {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3], "qwen2_5_vl": 1}
    assert operations["PatchImage"] == {"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2}
    image_processor.resample = 4  # PIL's BOX: the runtime has no such filter
    with pytest.raises(ValueError, match="resamples with PIL filter 4, which the runtime's processor lacks"):
        qwen_processor_config(image_processor, config)
    image_processor.resample, image_processor.do_resize = 3, False
    with pytest.raises(ValueError, match="does not resize .* set do_resize to true"):
        qwen_processor_config(image_processor, config)
    image_processor.do_resize, image_processor.size = True, {"height": 224, "width": 224}
    with pytest.raises(ValueError, match="gives no pixel bounds .* size.shortest_edge and size.longest_edge"):
        qwen_processor_config(image_processor, config)


def test_the_runtime_gemma3_processor_does_what_the_image_processor_does():
    image_processor = transformers.Gemma3ImageProcessorPil(size={"height": 64, "width": 64}, image_mean=[0.5, 0.4, 0.3])
    config = ARCHITECTURES["gemma3"].processor_config(image_processor, transformers.Gemma3Config())["processor"]
    operations = {t["operation"]["type"]: t["operation"].get("attrs", {}) for t in config["transforms"]}
    # no ConvertRGB: the runtime's decoded image is RGB already, and it would swap the channels
    assert config["name"] == "gemma_3_image_processing"
    assert list(operations) == ["DecodeImage", "Resize", "Rescale", "Normalize", "Permute3D"]
    assert operations["Resize"] == {"height": 64, "width": 64, "keep_aspect_ratio": 0, "interpolation": "LINEAR"}
    assert operations["Normalize"] == {"mean": [0.5, 0.4, 0.3], "std": [0.5, 0.5, 0.5]}
    assert operations["Permute3D"] == {"dims": [2, 0, 1]}


def test_a_model_without_the_tasks_outputs_is_refused_naming_them():
    """A detector whose outputs no detection pipeline reads (PP-OCR's text detector returns
    its probability map as last_hidden_state): refused, naming what it gives and what serves it."""
    import onnx_ir as ir

    from fx2onnx.hub.pipeline_tasks import keep_task_outputs

    given = ir.Value(name="last_hidden_state", shape=ir.Shape([1, 4]), type=ir.TensorType(ir.DataType.FLOAT))
    pixels = ir.Value(name="pixel_values", shape=ir.Shape([1, 4]), type=ir.TensorType(ir.DataType.FLOAT))
    node = ir.node("Relu", [pixels], outputs=[given])
    model = ir.Model(ir.Graph([pixels], [given], nodes=[node], opset_imports={"": 18}), ir_version=10)
    with pytest.raises(UnsupportedTaskError, match=re.escape(
            "outputs (last_hidden_state) include none of those object-detection pipelines read (logits, pred_boxes)")):
        keep_task_outputs(model, "object-detection")
    assert [v.name for v in model.graph.outputs] == ["last_hidden_state"]  # nothing removed


def test_example_images_are_of_the_size_the_model_takes():
    """The config's image size; DepthPro's (patches of patch_size pixels cut from the image at
    each of scaled_images_ratios) the smallest image whose quarter holds a patch, as its
    processor's 1536 pixels hold 384; 224 for a config that names none."""
    from fx2onnx.hub.pipeline_tasks import example_inputs, image_size

    assert image_size(transformers.ViTConfig(image_size=48)) == (48, 48)
    assert image_size(transformers.PretrainedConfig()) == (224, 224)
    assert image_size(transformers.DepthProConfig()) == (1536, 1536)
    encoders = {part: {"model_type": "dinov2"} for part in ("image_model_config", "patch_model_config", "fov_model_config")}
    config = transformers.DepthProConfig(patch_size=32, **encoders)
    assert image_size(config) == (128, 128)
    model = torch.nn.Linear(2, 2)
    assert example_inputs("depth-estimation", config, model, 1)["pixel_values"].shape == (3, 3, 128, 128)
