"""The files of an image-text-to-text folder for ONNX Runtime GenAI: the three models'
names (those Transformers.js gives them), `genai_config.json` with the vision,
embedding and decoder sections as the runtime reads them (src/config.h:
`model.vision`, `model.embedding`, `model.decoder`) and the image processor's
configuration, written from the source folder's transformers image processor.

The runtime's processor configuration is `genai_processor_config.json` (named by
`model.vision.config_filename`): transformers keeps its own processor's settings in
`processor_config.json`, which the folder keeps for transformers' clients.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from fx2onnx.hub.vision_language import vlm_gemma3

from fx2onnx.hub.vision_language import vlm_mistral3

from fx2onnx.hub.vision_language import vlm_qwen3
from fx2onnx.hub.shared.genai_config import genai_config

VISION, EMBEDDING, DECODER = "vision_encoder", "embed_tokens", "decoder_model_merged"
PARTS = {"vision": VISION, "embedding": EMBEDDING, "decoder": DECODER}  # the models and their file names
PROCESSOR_CONFIG = "genai_processor_config.json"

# PIL's resampling filters (transformers' `resample`) by the runtime's names
_INTERPOLATIONS = {0: "NEAREST", 1: "LANCZOS", 2: "LINEAR", 3: "CUBIC"}


def _session() -> dict[str, Any]:
    return {"log_id": "onnxruntime-genai", "provider_options": []}


def genai_vlm_config(
    config: Any, generation_config: Any, files: dict[str, str], decoder: ir.Model, genai_type: str
) -> dict[str, Any]:
    """`genai_config.json` of a folder whose models are ``files`` (vision, embedding and
    decoder paths in the folder); the decoder section as a causal LM's, fed `inputs_embeds`."""
    text = config.text_config
    written = genai_config(text, generation_config, files["decoder"], decoder)
    model = written["model"]
    inputs = model["decoder"]["inputs"]
    # a decoder declaring `input_ids` (Gemma 3's, for its image mask) is fed them beside the embeddings
    model["decoder"]["inputs"] = {"inputs_embeds": "inputs_embeds", **inputs}
    if "input_ids" not in {value.name for value in decoder.graph.inputs}:
        model["decoder"]["inputs"].pop("input_ids", None)
    model["type"] = genai_type
    # Qwen3-VL's rows carry DeepStack features beside the embeddings (vlm_qwen3.py); the
    # runtime sizes `image_features` and `inputs_embeds` by this
    model["decoder"]["hidden_size"] = vlm_qwen3.row_width(config)
    for key in ("image_token_id", "video_token_id", "vision_start_token_id"):
        if getattr(config, key, None) is not None:
            model[key] = int(getattr(config, key))
    model["embedding"] = {
        "filename": files["embedding"], "session_options": _session(),
        "inputs": {"input_ids": "input_ids", "image_features": "image_features"}, "outputs": {"inputs_embeds": "inputs_embeds"},
    }
    vision = config.vision_config
    if genai_type == vlm_mistral3.GENAI_TYPE:
        model["vision"] = vlm_mistral3.vision_section(config, files["vision"], PROCESSOR_CONFIG, _session())
        return written
    if genai_type == "gemma3":
        model["vision"] = {
            "filename": files["vision"], "config_filename": PROCESSOR_CONFIG, "session_options": _session(),
            "inputs": {"pixel_values": "pixel_values"}, "outputs": {"image_features": "image_features"},
        }
        return written
    model["vision"] = {
        "filename": files["vision"], "config_filename": PROCESSOR_CONFIG, "session_options": _session(),
        "spatial_merge_size": int(vision.spatial_merge_size), "patch_size": int(vision.patch_size),
        "window_size": int(getattr(vision, "window_size", 0) or 0),
        "tokens_per_second": float(getattr(vision, "tokens_per_second", 2.0) or 2.0),
        "inputs": {"pixel_values": "pixel_values", "image_grid_thw": "image_grid_thw"},
        "outputs": {"image_features": "image_features"},
    }
    return written


def _operation(name: str, kind: str, attrs: dict[str, Any] | None = None) -> dict[str, Any]:
    operation: dict[str, Any] = {"name": name, "type": kind}
    if attrs:
        operation["attrs"] = attrs
    return {"operation": operation}


def _interpolation(image_processor: Any) -> str:
    resample = int(getattr(image_processor, "resample", 3))
    if resample not in _INTERPOLATIONS:
        raise ValueError(f"The image processor resamples with PIL filter {resample}, which the runtime's processor lacks: "
                         f"it has {', '.join(f'{k} ({v})' for k, v in _INTERPOLATIONS.items())}.")
    return _INTERPOLATIONS[resample]


def _scaling(image_processor: Any) -> list[dict[str, Any]]:
    """The runtime's Rescale and Normalize doing what ``image_processor`` does after resizing."""
    transforms = []
    if getattr(image_processor, "do_rescale", True):
        transforms.append(_operation("rescale", "Rescale", {"rescale_factor": float(image_processor.rescale_factor)}))
    if getattr(image_processor, "do_normalize", True):
        transforms.append(_operation("normalize", "Normalize", {
            "mean": [float(v) for v in image_processor.image_mean], "std": [float(v) for v in image_processor.image_std],
        }))
    return transforms


def processor_config(genai_type: str, image_processor: Any, vision_config: Any, merge_size: int | None = None) -> dict[str, Any]:
    """`genai_processor_config.json` for the runtime's processor of ``genai_type``
    (``merge_size``: Mistral 3's spatial merge, which its vision config does not hold)."""
    if genai_type == "gemma3":
        return gemma3_processor_config(image_processor, vlm_gemma3.image_size(image_processor))
    if genai_type == vlm_mistral3.GENAI_TYPE:
        transforms = vlm_mistral3.processor_transforms(
            image_processor, int(vision_config.patch_size), int(merge_size or 1), _interpolation(image_processor),
            _scaling(image_processor), _operation,
        )
        return {"processor": {"name": vlm_mistral3.PROCESSOR_NAME, "transforms": transforms}}
    return qwen_processor_config(image_processor, vision_config)


def image_sizes_note(model_type: str, image_processor: Any) -> str:
    """What the folder's vision model takes, as export-hf says it."""
    if model_type == "gemma3":
        height, width = vlm_gemma3.image_size(image_processor)
        return f"vision model for {height}x{width} images (the runtime's processor resizes every image to that size)"
    if model_type == "mistral3":
        return (f"vision model for images of every size up to {vlm_mistral3.longest_edge(image_processor)} pixels a side "
                "(the runtime's processor rounds each side to the nearest multiple of the merged patch, transformers' "
                "rounds up: the same images when the sides are multiples already)")
    lowest, highest = pixel_bounds(image_processor)
    return (f"vision model for images of every size (the runtime's processor resizes each as transformers' does, "
            f"to between {lowest} and {highest} pixels)")


def pixel_bounds(image_processor: Any) -> tuple[int, int]:
    """The fewest and most pixels Qwen's image processor resizes an image to (its smart resize's bounds)."""
    size = getattr(image_processor, "size", None) or {}
    lowest = getattr(image_processor, "min_pixels", None) or size.get("shortest_edge")
    highest = getattr(image_processor, "max_pixels", None) or size.get("longest_edge")
    if not lowest or not highest:
        raise ValueError(
            f"The image processor ({type(image_processor).__name__}) gives no pixel bounds for its resize "
            f"(size {dict(size)}): preprocessor_config.json needs size.shortest_edge and size.longest_edge "
            "(or min_pixels and max_pixels), as Qwen's image processors save them."
        )
    return int(lowest), int(highest)


def gemma3_processor_config(image_processor: Any, size: tuple[int, int]) -> dict[str, Any]:
    """The runtime's Gemma 3 image processor: every image resized to ``size`` (height,
    width), scaled and normalized, channels first ([3, height, width] per image). The
    decoder gives RGB already: the runtime's ConvertRGB here would swap the channels."""
    transforms = [_operation("decode_image", "DecodeImage", {"color_space": "RGB"})]
    transforms.append(_operation("resize", "Resize", {
        "height": size[0], "width": size[1], "keep_aspect_ratio": 0, "interpolation": _interpolation(image_processor),
    }))
    transforms += _scaling(image_processor)
    transforms.append(_operation("to_channel_first", "Permute3D", {"dims": [2, 0, 1]}))
    return {"processor": {"name": "gemma_3_image_processing", "transforms": transforms}}


def qwen_processor_config(image_processor: Any, vision_config: Any) -> dict[str, Any]:
    """The runtime's Qwen2.5-VL image processor (onnxruntime-extensions' transforms) doing
    what ``image_processor`` does: each image resized to the multiple of the merged patch
    nearest its own size within the processor's pixel bounds (transformers' `smart_resize`),
    then cut into patches; the vision model takes every size."""
    if not getattr(image_processor, "do_resize", True):
        raise ValueError(
            "The image processor does not resize (do_resize is false), which the runtime's Qwen processor always does: "
            "set do_resize to true in preprocessor_config.json."
        )
    patch, merge = int(vision_config.patch_size), int(vision_config.spatial_merge_size)
    lowest, highest = pixel_bounds(image_processor)
    transforms = [_operation("decode_image", "DecodeImage", {"color_space": "RGB"})]
    if getattr(image_processor, "do_convert_rgb", True):
        transforms.append(_operation("convert_to_rgb", "ConvertRGB"))
    transforms.append(_operation("resize", "Resize", {
        "smart_resize": 1, "min_pixels": lowest, "max_pixels": highest, "keep_aspect_ratio": 0,
        "interpolation": _interpolation(image_processor), "patch_size": patch, "merge_size": merge,
    }))
    scaling = _scaling(image_processor)
    for operation in scaling:
        if operation["operation"]["type"] == "Normalize":
            operation["operation"]["attrs"]["qwen2_5_vl"] = 1
    transforms += scaling
    transforms.append(_operation("patch_image", "PatchImage", {
        "patch_size": patch, "temporal_patch_size": int(vision_config.temporal_patch_size), "merge_size": merge,
    }))
    return {"processor": {"name": "qwen2_5_image_processor", "transforms": transforms}}
