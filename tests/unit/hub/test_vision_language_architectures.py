"""Each image-text-to-text architecture's row (fx2onnx/hub/vision_language/), on tiny
configs and image processors, with no export: the runtime type, the row width the runtime
sizes `image_features` and `inputs_embeds` by, genai_config.json's vision section,
genai_processor_config.json's steps, what export-hf says of the image sizes, the
verification's image sizes, and the refusals before anything is written."""

from __future__ import annotations

import pytest

from fx2onnx.hub.vision_language import genai_files, mistral3
from fx2onnx.hub.vision_language.architectures import ARCHITECTURES, architecture_of

transformers = pytest.importorskip("transformers")


def _qwen2_5_vl():
    config = transformers.Qwen2_5_VLConfig(text_config=dict(hidden_size=64), vision_config=dict(window_size=56))
    processor = transformers.Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 64)
    return config, processor


def _qwen3_vl():
    config = transformers.Qwen3VLConfig(text_config=dict(hidden_size=64),
                                        vision_config=dict(patch_size=16, deepstack_visual_indexes=[0, 1, 2]))
    processor = transformers.Qwen2VLImageProcessorPil(patch_size=16, min_pixels=32 * 32, max_pixels=32 * 32 * 64)
    return config, processor


def _gemma3():
    return transformers.Gemma3Config(), transformers.Gemma3ImageProcessorPil(size={"height": 64, "width": 48})


def _mistral3():
    config = transformers.Mistral3Config(vision_config=dict(model_type="pixtral", patch_size=14, image_size=112),
                                         text_config=dict(model_type="mistral", hidden_size=64), spatial_merge_size=2)
    processor = transformers.PixtralImageProcessorPil(patch_size={"height": 28, "width": 28}, size={"longest_edge": 112})
    return config, processor


TINY = {"qwen2_5_vl": _qwen2_5_vl, "qwen3_vl": _qwen3_vl, "gemma3": _gemma3, "mistral3": _mistral3}
# what each architecture's rows, vision section and processor are (the runtime's names)
EXPECTED = {
    "qwen2_5_vl": dict(width=64, mrope=True, vision_keys=["spatial_merge_size", "patch_size", "window_size", "tokens_per_second"],
                       grid=True, processor="qwen2_5_image_processor", note="between 3136 and 50176 pixels"),
    "qwen3_vl": dict(width=64 * 4, mrope=True, vision_keys=["spatial_merge_size", "patch_size", "window_size", "tokens_per_second"],
                     grid=True, processor="qwen2_5_image_processor", note="between 1024 and 65536 pixels"),
    "gemma3": dict(width=None, mrope=False, vision_keys=[], grid=False, processor="gemma_3_image_processing",
                   note="vision model for 64x48 images"),
    "mistral3": dict(width=64, mrope=False, vision_keys=["spatial_merge_size", "patch_size"], grid=False,
                     processor="pixtral_image_processor", note="up to 112 pixels a side"),
}


def test_every_row_has_its_tiny_config_here():
    assert set(ARCHITECTURES) == set(TINY) == set(EXPECTED)


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_an_architecture_row_writes_the_runtime_settings(model_type):
    config, processor = TINY[model_type]()
    architecture = architecture_of(config)
    expected = EXPECTED[model_type]
    assert architecture is ARCHITECTURES[model_type] and architecture.genai_type == model_type
    assert architecture.row_width(config) == (expected["width"] or int(config.text_config.hidden_size))
    assert architecture.mrope is expected["mrope"]

    section = architecture.vision_section(config, "onnx/vision_encoder.onnx", genai_files.PROCESSOR_CONFIG)
    assert list(section) == ["filename", "config_filename", "session_options", *expected["vision_keys"], "inputs", "outputs"]
    assert section["config_filename"] == "genai_processor_config.json"
    assert section["inputs"] == {"pixel_values": "pixel_values", **({"image_grid_thw": "image_grid_thw"} if expected["grid"] else {})}

    written = architecture.processor_config(processor, config)["processor"]
    assert written["name"] == expected["processor"]
    steps = [step["operation"]["type"] for step in written["transforms"]]
    # decoded to RGB first (a ConvertRGB after it only where the processor converts), scaled, normalized
    assert steps[0] == "DecodeImage" and {"Resize", "Rescale", "Normalize"} <= set(steps)
    assert expected["note"] in architecture.image_sizes_note(processor)

    sizes = architecture.verification_sizes(None if model_type != "mistral3" else _model_stub(config), processor)
    assert sizes and all(height > 0 and width > 0 for height, width in sizes)


def _model_stub(config):
    class Stub:
        pass

    stub = Stub()
    stub.config = config
    return stub


def test_mistral3_verification_images_are_multiples_of_the_merged_patch():
    config, processor = _mistral3()
    sizes = ARCHITECTURES["mistral3"].verification_sizes(_model_stub(config), processor)
    assert len(set(sizes)) == 2 and all(h % 28 == 0 and w % 28 == 0 for h, w in sizes)


def test_qwen_verification_images_are_not_multiples_of_the_merged_patch():
    config, processor = _qwen2_5_vl()
    sizes = ARCHITECTURES["qwen2_5_vl"].verification_sizes(None, processor)
    assert len(set(sizes)) == 2 and all(h % 28 and w % 28 for h, w in sizes)


def test_a_model_type_without_a_row_is_refused_naming_the_rows():
    with pytest.raises(NotImplementedError, match=f"for model types {', '.join(ARCHITECTURES)}; llava is not one of them"):
        architecture_of(transformers.LlavaConfig())


def test_a_row_refuses_a_configuration_its_runtime_type_cannot_run():
    with pytest.raises(NotImplementedError, match="puts 64 tokens per image"):
        architecture_of(transformers.Gemma3Config(mm_tokens_per_image=64))
    config, processor = _mistral3()
    processor.do_resize = False
    with pytest.raises(ValueError, match="does not resize"):
        mistral3.check_image_processor(processor, config)
