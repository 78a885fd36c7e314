"""The files of an image-text-to-text folder for ONNX Runtime GenAI: the three models'
names (those Transformers.js gives them), `genai_config.json` with the vision,
embedding and decoder sections as the runtime reads them (src/config.h:
`model.vision`, `model.embedding`, `model.decoder`), and the steps the architectures'
image processor configurations are written with.

The runtime's processor configuration is `genai_processor_config.json` (named by
`model.vision.config_filename`): transformers keeps its own processor's settings in
`processor_config.json`, which the folder keeps for transformers' clients.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from fx2onnx.hub.shared.genai_config import genai_config, session_options
from fx2onnx.hub.vision_language.architecture import VisionLanguageArchitecture

VISION, EMBEDDING, DECODER = "vision_encoder", "embed_tokens", "decoder_model_merged"
PARTS = {"vision": VISION, "embedding": EMBEDDING, "decoder": DECODER}  # the models and their file names
# a part a folder may have beside the three (Gemma 4's and Gemma 3n's audio model, under Transformers.js's session name)
OPTIONAL_PARTS = {"audio": "audio_encoder"}
PROCESSOR_CONFIG = "genai_processor_config.json"

# PIL's resampling filters (transformers' `resample`) by the runtime's names
_INTERPOLATIONS = {0: "NEAREST", 1: "LANCZOS", 2: "LINEAR", 3: "CUBIC"}


def genai_vlm_config(
    config: Any, generation_config: Any, files: dict[str, str], decoder: ir.Model, architecture: VisionLanguageArchitecture
) -> dict[str, Any]:
    """`genai_config.json` of a folder whose models are ``files`` (vision, embedding and
    decoder paths in the folder); the decoder section as a causal LM's, fed `inputs_embeds`."""
    written = embeds_fed_config(config.text_config, generation_config, files, decoder, ["image_features"])
    model = written["model"]
    model["type"] = architecture.genai_type
    # wide rows carry features beside the embeddings (Qwen3-VL's DeepStack); the runtime
    # sizes `image_features` and `inputs_embeds` by this
    model["decoder"]["hidden_size"] = architecture.row_width(config)
    for key in ("image_token_id", "video_token_id", "vision_start_token_id"):
        if getattr(config, key, None) is not None:
            model[key] = int(getattr(config, key))
    model["vision"] = architecture.vision_section(config, files["vision"], PROCESSOR_CONFIG)
    return written


def embeds_fed_config(
    text_config: Any, generation_config: Any, files: dict[str, str], decoder: ir.Model, features: list[str]
) -> dict[str, Any]:
    """`genai_config.json` of a decoder fed `inputs_embeds` (its section as a causal LM's)
    and of the embedding model that makes them from `input_ids` and the ``features``."""
    written = genai_config(text_config, generation_config, files["decoder"], decoder)
    model = written["model"]
    # a decoder declaring `input_ids` (Gemma 3's, for its image mask) is fed them beside the embeddings
    model["decoder"]["inputs"] = {"inputs_embeds": "inputs_embeds", **model["decoder"]["inputs"]}
    if "input_ids" not in {value.name for value in decoder.graph.inputs}:
        model["decoder"]["inputs"].pop("input_ids", None)
    model["embedding"] = {
        "filename": files["embedding"], "session_options": session_options(),
        "inputs": {"input_ids": "input_ids", **{name: name for name in features}}, "outputs": {"inputs_embeds": "inputs_embeds"},
    }
    return written


def vision_section(filename: str, extra: dict[str, Any] | None = None, grid: bool = False) -> dict[str, Any]:
    """genai_config.json's `model.vision`: the model, its processor's configuration, the
    architecture's ``extra`` settings, `pixel_values` (and `image_grid_thw` with ``grid``) in."""
    inputs = {"pixel_values": "pixel_values", **({"image_grid_thw": "image_grid_thw"} if grid else {})}
    return {
        "filename": filename, "config_filename": PROCESSOR_CONFIG, "session_options": session_options(), **(extra or {}),
        "inputs": inputs, "outputs": {"image_features": "image_features"},
    }


def operation(name: str, kind: str, attrs: dict[str, Any] | None = None) -> dict[str, Any]:
    """One step of the runtime's image processor."""
    step: dict[str, Any] = {"name": name, "type": kind}
    if attrs:
        step["attrs"] = attrs
    return {"operation": step}


def interpolation(image_processor: Any) -> str:
    """The runtime's name of the image processor's resampling filter."""
    resample = int(getattr(image_processor, "resample", 3))
    if resample not in _INTERPOLATIONS:
        raise ValueError(f"The image processor resamples with PIL filter {resample}, which the runtime's processor lacks: "
                         f"it has {', '.join(f'{k} ({v})' for k, v in _INTERPOLATIONS.items())}.")
    return _INTERPOLATIONS[resample]


def scaling(image_processor: Any) -> list[dict[str, Any]]:
    """The runtime's Rescale and Normalize doing what ``image_processor`` does after resizing."""
    transforms = []
    if getattr(image_processor, "do_rescale", True):
        transforms.append(operation("rescale", "Rescale", {"rescale_factor": float(image_processor.rescale_factor)}))
    if getattr(image_processor, "do_normalize", True):
        transforms.append(operation("normalize", "Normalize", {
            "mean": [float(v) for v in image_processor.image_mean], "std": [float(v) for v in image_processor.image_std],
        }))
    return transforms


def decoded_rgb() -> dict[str, Any]:
    """The runtime's first step: the image decoded to RGB (its ConvertRGB after it would
    swap the channels of an image decoded to RGB already)."""
    return operation("decode_image", "DecodeImage", {"color_space": "RGB"})
