"""The single-model tasks of `export-hf`: one `onnx/model.onnx` that a pipeline feeds
once (classifiers, detectors, segmenters, CTC speech recognition, CLIP-style zero-shot
image classification, VITS text-to-audio...).

Each task (`PIPELINE_TASKS`) says which auto class loads it, which auto mappings of
transformers hold its architectures, what its example inputs are (`InputKind`) and which
outputs the folder keeps, named as Transformers.js's pipelines and Optimum's ONNX configs
read them (`logits`, `start_logits`/`end_logits`, `pred_boxes`, `predicted_depth`,
`logits_per_image`, `waveform`...). Everything else the model returns (hidden states, auxiliary
outputs) is dropped from the graph with the nodes only it needed.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import torch


TEXT_CLASSIFICATION = "text-classification"
TOKEN_CLASSIFICATION = "token-classification"
QUESTION_ANSWERING = "question-answering"
FILL_MASK = "fill-mask"
MULTIPLE_CHOICE = "multiple-choice"
OBJECT_DETECTION = "object-detection"
IMAGE_SEGMENTATION = "image-segmentation"
DEPTH_ESTIMATION = "depth-estimation"
AUDIO_CLASSIFICATION = "audio-classification"
ZERO_SHOT_IMAGE_CLASSIFICATION = "zero-shot-image-classification"
# text to a waveform in one pass (VITS: recipes/text_to_audio.py)
TEXT_TO_AUDIO = "text-to-audio"
# CTC models serve automatic-speech-recognition (loading.SPEECH_RECOGNITION) without a decoder
CTC_SPEECH_RECOGNITION = "automatic-speech-recognition"


class InputKind(Enum):
    TEXT = "text"  # input_ids, attention_mask (token_type_ids where the model takes them)
    CHOICES = "choices"  # the same, (batch, choices, tokens)
    IMAGE = "image"  # pixel_values
    AUDIO = "audio"  # input_values (a waveform, or a spectrogram) or input_features
    TEXT_AND_IMAGE = "text and image"  # CLIP-style: texts and images, batches apart


@dataclass(frozen=True)
class PipelineTask:
    auto_class: str
    mappings: tuple[str, ...]
    inputs: InputKind
    # the outputs kept, where the model gives them (a segmenter gives one of two sets)
    outputs: tuple[str, ...]


def _mapping(name: str) -> str:
    return f"MODEL_FOR_{name}_MAPPING_NAMES"


PIPELINE_TASKS: dict[str, PipelineTask] = {
    TEXT_CLASSIFICATION: PipelineTask(
        "AutoModelForSequenceClassification", (_mapping("SEQUENCE_CLASSIFICATION"),), InputKind.TEXT, ("logits",)),
    TOKEN_CLASSIFICATION: PipelineTask(
        "AutoModelForTokenClassification", (_mapping("TOKEN_CLASSIFICATION"),), InputKind.TEXT, ("logits",)),
    QUESTION_ANSWERING: PipelineTask(
        "AutoModelForQuestionAnswering", (_mapping("QUESTION_ANSWERING"),), InputKind.TEXT, ("start_logits", "end_logits")),
    FILL_MASK: PipelineTask("AutoModelForMaskedLM", (_mapping("MASKED_LM"),), InputKind.TEXT, ("logits",)),
    MULTIPLE_CHOICE: PipelineTask("AutoModelForMultipleChoice", (_mapping("MULTIPLE_CHOICE"),), InputKind.CHOICES, ("logits",)),
    OBJECT_DETECTION: PipelineTask(
        "AutoModelForObjectDetection", (_mapping("OBJECT_DETECTION"),), InputKind.IMAGE, ("logits", "pred_boxes")),
    IMAGE_SEGMENTATION: PipelineTask(
        "AutoModelForImageSegmentation",
        (_mapping("SEMANTIC_SEGMENTATION"), _mapping("UNIVERSAL_SEGMENTATION"), _mapping("INSTANCE_SEGMENTATION"),
         _mapping("IMAGE_SEGMENTATION")),
        InputKind.IMAGE, ("logits", "pred_boxes", "pred_masks", "class_queries_logits", "masks_queries_logits"),
    ),
    DEPTH_ESTIMATION: PipelineTask(
        "AutoModelForDepthEstimation", (_mapping("DEPTH_ESTIMATION"),), InputKind.IMAGE, ("predicted_depth",)),
    CTC_SPEECH_RECOGNITION: PipelineTask("AutoModelForCTC", (_mapping("CTC"),), InputKind.AUDIO, ("logits",)),
    AUDIO_CLASSIFICATION: PipelineTask(
        "AutoModelForAudioClassification", (_mapping("AUDIO_CLASSIFICATION"),), InputKind.AUDIO, ("logits",)),
    ZERO_SHOT_IMAGE_CLASSIFICATION: PipelineTask(
        "AutoModelForZeroShotImageClassification", (_mapping("ZERO_SHOT_IMAGE_CLASSIFICATION"),), InputKind.TEXT_AND_IMAGE,
        ("logits_per_image", "logits_per_text", "text_embeds", "image_embeds"),
    ),
    # a spectrogram model (SpeechT5) is text-to-audio too, as Transformers.js's pipeline files it: refused by its cause
    TEXT_TO_AUDIO: PipelineTask(
        "AutoModelForTextToWaveform", (_mapping("TEXT_TO_WAVEFORM"), _mapping("TEXT_TO_SPECTROGRAM")), InputKind.TEXT,
        ("waveform",),
    ),
}

# the model types whose text-to-audio folder export-hf writes: VITS's one pass from token ids to a
# waveform, SpeechT5's spectrogram step by step and its vocoder (recipes/speecht5_text_to_audio.py)
TEXT_TO_AUDIO_MODEL_TYPES = ("vits", "speecht5")


def text_to_audio_refusal(config: Any) -> str | None:
    """Why export-hf writes no text-to-audio folder of ``config``'s model (None for VITS and SpeechT5):
    said before its weights are loaded."""
    model_type = getattr(config, "model_type", None)
    if model_type in TEXT_TO_AUDIO_MODEL_TYPES:
        return None
    architecture = ", ".join(getattr(config, "architectures", None) or [str(model_type)])
    return (
        f"{architecture} ({model_type}): export-hf writes text-to-audio folders of {', '.join(TEXT_TO_AUDIO_MODEL_TYPES)} "
        "(VITS's one pass from token ids to a waveform, SpeechT5's spectrogram and HiFi-GAN vocoder) only; this model "
        "generates its audio otherwise, which no recipe of export-hf writes. Nothing was written. Export its modules "
        "with fx2onnx.dynamo_export."
    )


# A CLIP-style model's images are batched apart from its texts (one image, every label)
IMAGE_BATCH = "image_batch_size"
NUM_CHOICES = "num_choices"


# transformers files some generation models under fill-mask too (BART's LM head): those stay generation models
_GENERATION_MAPPINGS = (
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
)


def served_task(architectures: list[str]) -> str | None:
    """The task of this table that transformers files one of ``architectures`` under
    (None when none is, or when the class is a generation model as well)."""
    from fx2onnx.hub import tasks
    for architecture in architectures:
        if any(tasks.is_filed_under(architecture, mapping) for mapping in _GENERATION_MAPPINGS):
            continue
        for task, spec in PIPELINE_TASKS.items():
            if any(tasks.is_filed_under(architecture, mapping) for mapping in spec.mappings):
                return task
    return None


def auto_class_for(task: str, config: Any) -> str:
    """The transformers auto class that loads ``config``'s model for ``task``: for a
    segmenter, the one whose mapping files the config's architecture."""
    spec = PIPELINE_TASKS[task]
    if task == IMAGE_SEGMENTATION:
        from fx2onnx.hub import tasks
        architectures = list(getattr(config, "architectures", None) or [])
        for mapping, auto in (
            (_mapping("UNIVERSAL_SEGMENTATION"), "AutoModelForUniversalSegmentation"),
            (_mapping("INSTANCE_SEGMENTATION"), "AutoModelForInstanceSegmentation"),
            (_mapping("SEMANTIC_SEGMENTATION"), "AutoModelForSemanticSegmentation"),
            (_mapping("IMAGE_SEGMENTATION"), "AutoModelForImageSegmentation"),
        ):
            if any(tasks.is_filed_under(a, mapping) for a in architectures):
                return auto
        return "AutoModelForSemanticSegmentation"
    if task == TEXT_TO_AUDIO and getattr(config, "model_type", None) == "speecht5":
        return "AutoModelForTextToSpectrogram"
    return spec.auto_class


def _sub(config: Any, name: str) -> Any:
    return getattr(config, name, None) or config


def _size(value: Any, default: int) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        return int(value[0]), int(value[-1])
    return (int(value), int(value)) if value else (default, default)


def text_inputs(config: Any, model: torch.nn.Module, size: int, shape: tuple[int, ...] | None = None) -> dict[str, torch.Tensor]:
    """input_ids (ending with the end-of-text token, where the config has one) and
    attention_mask of ``shape`` (default batch 2 + size, 7 + 4 * size tokens), the second
    size with its first row padded at the end, and token_type_ids (zeros) where the model
    takes them."""
    text = _sub(config, "text_config")
    generator = torch.Generator().manual_seed(size)
    shape = shape or (2 + size, 7 + 4 * size)
    vocab = int(getattr(text, "vocab_size", 100))
    mask = torch.ones(shape, dtype=torch.int64)
    if size:
        mask.view(-1, shape[-1])[0, -3:] = 0
    ids = torch.randint(min(3, vocab - 1), vocab, shape, generator=generator)
    eos = getattr(text, "eos_token_id", None)
    if isinstance(eos, int) and 0 <= eos < vocab:  # as tokenizers end a text (BART's classifier reads its last eos)
        ids[..., -1] = eos
    inputs = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in inspect.signature(model.forward).parameters and getattr(text, "type_vocab_size", 0):
        inputs["token_type_ids"] = torch.zeros(shape, dtype=torch.int64)
    return inputs


# how much taller and wider the second example's images are for a model that takes any image
# size: multiples of 32, the largest stride of common detectors' feature maps, and unequal
GROWN_IMAGE = (32, 64)


# the input kinds whose example has images (pixel_values)
IMAGE_KINDS = (InputKind.IMAGE, InputKind.TEXT_AND_IMAGE)


def image_size(config: Any) -> tuple[int, int]:
    """The (height, width) of the images the model of ``config`` takes: its (vision
    config's) image size; for a model that encodes an image as patches of several scales
    (DepthPro: patches of `patch_size` pixels cut from the image scaled by each of
    `scaled_images_ratios`), the smallest image whose smallest scale holds a patch, the
    size of its processor's images (1536 for 384 and a quarter); else 224."""
    vision = _sub(config, "vision_config")
    size = getattr(vision, "image_size", None)
    if size:
        return _size(size, 224)
    ratios, patch = getattr(config, "scaled_images_ratios", None), getattr(config, "patch_size", None)
    if ratios and isinstance(patch, int):
        side = math.ceil(patch / min(ratios))
        return side, side
    return 224, 224


def image_inputs(config: Any, batch: int, seed: int, grown: bool = False) -> dict[str, torch.Tensor]:
    """pixel_values of ``batch`` images of the model's size (`image_size`); ``grown``: taller
    and wider by GROWN_IMAGE."""
    vision = _sub(config, "vision_config")
    height, width = image_size(config)
    if grown:
        height, width = height + GROWN_IMAGE[0], width + GROWN_IMAGE[1]
    channels = int(getattr(vision, "num_channels", 3) or 3)
    generator = torch.Generator().manual_seed(seed)
    return {"pixel_values": torch.randn(batch, channels, height, width, generator=generator)}


def _first_layer(model: torch.nn.Module) -> torch.nn.Module | None:
    """The first layer with weights (a leaf module: a model's own parameters, a masking
    embedding, are no layer) of the model's base model (a head may be built before it):
    the one that reads its input."""
    base = getattr(model, "base_model", None) or model
    return next((m for m in base.modules()
                 if next(m.children(), None) is None and next(m.parameters(recurse=False), None) is not None), None)


def _frame_width(config: Any, model: torch.nn.Module) -> int | None:
    """The width of each frame of a spectrogram given time first, (batch, frames, width):
    what the model's first layer reads (mel bins, or frames stacked by the feature
    extractor: W2V-BERT's 2 x 80, Granite Speech 5's 4 x 80), or, when that layer reads the
    spectrogram as a one-channel image (Parakeet's convolutions), the mel bins of the
    config or of its encoder's; None for a spectrogram given mel bins first (Whisper's
    first convolution reads them as its channels)."""
    first = _first_layer(model)
    if isinstance(first, torch.nn.Linear):
        return first.in_features
    if isinstance(first, torch.nn.LayerNorm):
        return int(first.normalized_shape[-1])
    if isinstance(first, torch.nn.Conv2d) and first.in_channels == 1:
        mel_bins = getattr(config, "num_mel_bins", None) or getattr(_sub(config, "encoder_config"), "num_mel_bins", None)
        return int(mel_bins or 80)
    return None


def audio_inputs(config: Any, model: torch.nn.Module, size: int, with_mask: bool = False) -> dict[str, torch.Tensor]:
    """An audio model's example input of ``size`` 0 or 1, of the shape its config and first
    layer give; ``with_mask``: with the attention mask of a padded batch where the input has
    a time axis (the waveform, or frames first), its first row's last quarter padded."""
    inputs = _audio_values(config, model, size)
    name, values = next(iter(inputs.items()))
    if with_mask and (name == "input_values" or _frame_width(config, model) is not None):
        mask = torch.ones(values.shape[:2], dtype=torch.int64)
        mask[0, -(values.shape[1] // 4):] = 0
        inputs["attention_mask"] = mask
    return inputs


def _audio_values(config: Any, model: torch.nn.Module, size: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(size)
    batch = 2 + size
    name = getattr(model, "main_input_name", "input_values")
    mel_bins = getattr(config, "num_mel_bins", None)
    if name == "input_features":
        width = _frame_width(config, model)
        if width is not None:  # frames first: 3 s and more of 10 ms frames, past block-wise attention's blocks
            return {name: torch.randn(batch, 300 + 60 * size, width, generator=generator)}
        # mel bins first, of the length the encoder's positions fix
        frames = 2 * int(getattr(config, "max_source_positions", 1500))
        return {name: torch.randn(batch, int(mel_bins or 80), frames, generator=generator)}
    if mel_bins and getattr(config, "max_length", None):  # AST: (frames, mel bins) of a fixed length
        return {name: torch.randn(batch, int(config.max_length), int(mel_bins), generator=generator)}
    # a waveform: a tenth of a second at 16 kHz and more, past the feature encoder's receptive field
    return {name: torch.randn(batch, 1600 + 400 * size, generator=generator)}


def example_inputs(
    task: str, config: Any, model: torch.nn.Module, size: int, audio_mask: bool = False, any_image_size: bool = False,
) -> dict[str, torch.Tensor]:
    """Example inputs of ``task``'s model, its float inputs in the model's dtype; ``size`` 0
    or 1 picks one of two shapes; ``audio_mask``: an audio model's with the mask of a
    padded batch (the folder's feature extractor returns one, speech/audio_mask.py);
    ``any_image_size``: an image model whose folder takes any height and width gets images
    of another size at ``size`` 1 too."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    inputs = _inputs_of(task, config, model, size, audio_mask, any_image_size)
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}


def _question_and_context(config: Any, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``inputs`` as a question and its context, separated as a pair tokenizer writes them
    where the config names its separator: `q </s></s> c </s>` where the separator also ends
    a text (RoBERTa's, Longformer's: its forward finds the question by its three separators),
    else `q [SEP] c [SEP]`."""
    text = _sub(config, "text_config")
    sep, vocab = getattr(text, "sep_token_id", None), int(getattr(text, "vocab_size", 100))
    if not isinstance(sep, int) or not 0 <= sep < vocab:
        return inputs
    ids = inputs["input_ids"].clone()
    ids[..., 2] = sep
    ids[..., -1] = sep
    if sep == getattr(text, "eos_token_id", None):
        ids[..., 3] = sep
    return {**inputs, "input_ids": ids}


def _inputs_of(
    task: str, config: Any, model: torch.nn.Module, size: int, audio_mask: bool, any_image_size: bool = False,
) -> dict[str, torch.Tensor]:
    kind = PIPELINE_TASKS[task].inputs
    if kind is InputKind.TEXT and task == QUESTION_ANSWERING:
        return _question_and_context(config, text_inputs(config, model, size))
    if kind is InputKind.TEXT:
        return text_inputs(config, model, size)
    if kind is InputKind.CHOICES:
        return text_inputs(config, model, size, (2 + size, 2 + size, 7 + 4 * size))
    if kind is InputKind.IMAGE:
        return image_inputs(config, 2 + size, size, grown=any_image_size and size == 1)
    if kind is InputKind.AUDIO:
        return audio_inputs(config, model, size, audio_mask)
    # texts and images in batches of their own: 3 labels and 2 images, then 4 and 1
    images = image_inputs(config, 2 - size, size, grown=any_image_size and size == 1)
    return {**text_inputs(config, model, size, (3 + size, 7 + 4 * size)), **images}


def extra_dim_roles(
    task: str, config: Any = None, model: torch.nn.Module | None = None, audio_mask: bool = False,
) -> dict[str, dict[int, str]]:
    """The dim names of ``task``'s inputs that differ from the other tasks' (dim_roles);
    with the model, a spectrogram given time first has its frames named as well, and with
    ``audio_mask`` the mask of a padded batch the time of the audio input it masks."""
    from fx2onnx.hub.shared.dim_roles import BATCH, SEQUENCE
    from fx2onnx.hub.speech.audio_mask import SAMPLES

    if PIPELINE_TASKS[task].inputs is InputKind.CHOICES:
        roles = {0: BATCH, 1: NUM_CHOICES, 2: SEQUENCE}
        return {"input_ids": roles, "attention_mask": roles, "token_type_ids": roles}
    if PIPELINE_TASKS[task].inputs is InputKind.TEXT_AND_IMAGE:
        return {"pixel_values": {0: IMAGE_BATCH}}
    if PIPELINE_TASKS[task].inputs is InputKind.AUDIO:
        time_first = model is not None and _frame_width(config, model) is not None
        roles = {"input_values": {0: BATCH}, "input_features": {0: BATCH, 1: SEQUENCE} if time_first else {0: BATCH}}
        if audio_mask and getattr(model, "main_input_name", None) == "input_values":  # a waveform's samples
            roles.update({"input_values": {0: BATCH, 1: SAMPLES}, "attention_mask": {0: BATCH, 1: SAMPLES}})
        return roles
    return {}


def _pixels(model: ir.Model) -> ir.Value | None:
    """The model's ``pixel_values`` input of rank 4, or None."""
    pixels = next((value for value in model.graph.inputs if value.name == "pixel_values"), None)
    return pixels if pixels is not None and pixels.shape is not None and len(pixels.shape) == 4 else None


def dynamic_image_dims(model: ir.Model) -> bool:
    """Whether the export left the height and width of ``pixel_values`` dynamic (either)."""
    pixels = _pixels(model)
    return pixels is not None and any(isinstance(pixels.shape[index], ir.SymbolicDim) for index in (2, 3))


def square_image_dims(model: ir.Model) -> bool:
    """Whether the export gave the height and width of ``pixel_values`` one symbol (the
    capture followed a branch taken for square images only)."""
    pixels = _pixels(model)
    if pixels is None:
        return False
    height, width = pixels.shape[2], pixels.shape[3]
    return isinstance(height, ir.SymbolicDim) and height.value is not None and height == width


def name_image_dims(model: ir.Model) -> None:
    """Name the height and width of ``pixel_values`` where the export left them dynamic
    (models that interpolate their position embeddings take any image size)."""
    from fx2onnx.onnx_passes import rename_dims

    pixels = _pixels(model)
    if pixels is None:
        return
    symbols = {
        str(pixels.shape[index].value): name for index, name in ((2, "height"), (3, "width"))
        if isinstance(pixels.shape[index], ir.SymbolicDim) and pixels.shape[index].value
    }
    if symbols:
        rename_dims(model, symbols)


def names_height_and_width(shape: Sequence[Any] | None) -> bool:
    """Whether a ``pixel_values`` shape (batch, channels, height, width) names its height and
    width (dims named rather than sizes)."""
    return shape is not None and len(shape) == 4 and all(isinstance(shape[d], str) and shape[d] for d in (2, 3))


def takes_any_image_size(session: Any) -> bool:
    """Whether the session's ``pixel_values`` has its height and width dynamic (`names_height_and_width`)."""
    pixels = next((i for i in session.get_inputs() if i.name == "pixel_values"), None)
    return names_height_and_width(pixels.shape if pixels is not None else None)


def keep_image_size(model: ir.Model, height: int, width: int) -> bool:
    """Write the height and width of ``pixel_values`` as the static ``height`` and ``width``
    (the graph computes at the example's size only); returns whether the model has that input."""
    pixels = _pixels(model)
    if pixels is None:
        return False
    pixels.shape = ir.Shape([pixels.shape[0], pixels.shape[1], height, width])
    return True


def keep_task_outputs(model: ir.Model, task: str) -> list[str]:
    """Keep only ``task``'s outputs in ``model`` (and the nodes they need); returns their
    names. A model that gives none of them is refused, naming what it gives."""
    from fx2onnx.hub.tasks import UnsupportedTaskError

    wanted = PIPELINE_TASKS[task].outputs
    kept = [value for value in model.graph.outputs if value.name in wanted]
    if not kept:
        given = ", ".join(str(value.name) for value in model.graph.outputs)
        raise UnsupportedTaskError(
            f"{task}: the model's outputs ({given}) include none of those {task} pipelines read ({', '.join(wanted)}). "
            "Export it with --task feature-extraction or with fx2onnx.dynamo_export."
        )
    model.graph.outputs.clear()
    model.graph.outputs.extend(kept)
    common_passes.RemoveUnusedNodesPass()(model)
    return [str(value.name) for value in kept]
