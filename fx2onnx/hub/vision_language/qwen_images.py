"""What Qwen2.5-VL and Qwen3-VL share as ONNX Runtime GenAI runs them: a vision model for
images of any size (`pixel_values` [patches, channels x temporal x patch x patch] and
`image_grid_thw` [images, 3] -> `image_features` [image tokens, row width]; the runtime runs it
once per image, Transformers.js once for a prompt's images), its packed attention, the runtime's Qwen image processor (each image
resized as transformers' `smart_resize` does), the 3-D mRoPE positions, and the
verification's prompt of two images of different sizes, neither a multiple of the merged
patch. transformers computes the vision tower's layouts from the grid with `.tolist()`
loops; the architectures compute them in the graph from the grid's numbers and the patch
count (vision_grid.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.export import Dim

import fx2onnx
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.shared.verification import run_session
from fx2onnx.hub.vision_language import genai_files, parts
from fx2onnx.hub.vision_language.architecture import Prompt, VisionLanguageArchitecture, prompt_text

# the packed (block-diagonal) attention of the vision tower, registered with transformers
# under a name with "flash" in it: transformers then hands it the segment bounds as a
# tensor instead of splitting the sequence with `.tolist()` (a data-dependent split)
PACKED_ATTENTION = "fx2onnx_flash_packed_vision"
# the (height, width) of the verification's two random images: neither a multiple of a merged patch (28 or 32 pixels)
IMAGE_SIZES = ((50, 90), (100, 44))
# the vision model's grid input: ONNX Runtime GenAI and Transformers.js feed Qwen2.5-VL's and Qwen3-VL's
# as `image_grid_thw`; Transformers.js feeds Qwen2-VL's as `grid_thw`
GRID_INPUT = "image_grid_thw"


def _packed_attention(module, query, key, value, attention_mask=None, scaling=None, cu_seq_lens_q=None, **kwargs):
    """Attention within each segment that ``cu_seq_lens_q`` bounds, as one masked attention."""
    positions = torch.arange(query.shape[2], device=query.device, dtype=cu_seq_lens_q.dtype)
    segment = (positions[:, None] >= cu_seq_lens_q[None, 1:]).sum(-1)
    mask = segment[:, None] == segment[None, :]
    output = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return output.transpose(1, 2).contiguous(), None


def example_grid(loaded: LoadedModel) -> torch.Tensor:
    """The patch grids ([[1, h, w], ...]) of the vision model's example: two images (the
    image count stays a dim of the model), 3 x 5 and 2 x 2 merged tokens, grids that are not
    alike and that Qwen2.5-VL's windows do not tile."""
    merge = int(loaded.config.vision_config.spatial_merge_size)
    return torch.tensor([[1, 3 * merge, 5 * merge], [1, 2 * merge, 2 * merge]], dtype=torch.int64)


def vision_inputs(loaded: LoadedModel, grid: torch.Tensor, grid_input: str = GRID_INPUT) -> dict[str, torch.Tensor]:
    vision = loaded.config.vision_config
    patches = int(grid.prod())
    width = int(vision.in_channels) * int(vision.temporal_patch_size) * int(vision.patch_size) ** 2
    pixels = torch.randn(patches, width, generator=torch.Generator().manual_seed(0))
    return parts.as_loaded({"pixel_values": pixels, grid_input: grid}, loaded)


def parts_exporter(
    vision_model: Callable[[torch.nn.Module], torch.nn.Module], grid_input: str = GRID_INPUT
) -> Callable[..., dict[str, Any]]:
    """The export of the three parts with the vision tower ``vision_model`` wraps (its grid
    input named ``grid_input``)."""

    def export_parts(loaded: LoadedModel, options: fx2onnx.ExportOptions, image_processor: Any,
                     architecture: VisionLanguageArchitecture) -> dict[str, fx2onnx.ONNXProgram]:
        model = loaded.model
        # any number of patches, of one image (the runtime runs the model per image) or of several
        # (Transformers.js runs it once for a prompt's images)
        vision_options = dataclasses.replace(
            parts.without_causal_mask(options), dynamic_shapes={"pixel_values": {0: Dim.AUTO}, grid_input: {0: Dim.AUTO}}
        )
        with parts.attention_implementation(model.model.visual.config, PACKED_ATTENTION, _packed_attention):
            vision = fx2onnx.dynamo_export(
                vision_model(model), **vision_inputs(loaded, example_grid(loaded), grid_input), export_options=vision_options
            )
        return parts.export_text_parts(loaded, options, architecture, {"vision": vision})

    return export_parts


def vision_section(config: Any, filename: str, processor_file: str) -> dict[str, Any]:
    vision = config.vision_config
    return genai_files.vision_section(filename, {
        "spatial_merge_size": int(vision.spatial_merge_size), "patch_size": int(vision.patch_size),
        "window_size": int(getattr(vision, "window_size", 0) or 0),
        "tokens_per_second": float(getattr(vision, "tokens_per_second", 2.0) or 2.0),
    }, grid=True)


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


def processor_config(image_processor: Any, config: Any) -> dict[str, Any]:
    """The runtime's Qwen2.5-VL image processor (onnxruntime-extensions' transforms) doing
    what ``image_processor`` does: each image resized to the multiple of the merged patch
    nearest its own size within the processor's pixel bounds (transformers' `smart_resize`),
    then cut into patches; the vision model takes every size."""
    if not getattr(image_processor, "do_resize", True):
        raise ValueError(
            "The image processor does not resize (do_resize is false), which the runtime's Qwen processor always does: "
            "set do_resize to true in preprocessor_config.json."
        )
    vision_config = config.vision_config
    patch, merge = int(vision_config.patch_size), int(vision_config.spatial_merge_size)
    lowest, highest = pixel_bounds(image_processor)
    transforms = [genai_files.decoded_rgb()]
    if getattr(image_processor, "do_convert_rgb", True):
        transforms.append(genai_files.operation("convert_to_rgb", "ConvertRGB"))
    transforms.append(genai_files.operation("resize", "Resize", {
        "smart_resize": 1, "min_pixels": lowest, "max_pixels": highest, "keep_aspect_ratio": 0,
        "interpolation": genai_files.interpolation(image_processor), "patch_size": patch, "merge_size": merge,
    }))
    scaling = genai_files.scaling(image_processor)
    for operation in scaling:
        if operation["operation"]["type"] == "Normalize":
            operation["operation"]["attrs"]["qwen2_5_vl"] = 1
    transforms += scaling
    transforms.append(genai_files.operation("patch_image", "PatchImage", {
        "patch_size": patch, "temporal_patch_size": int(vision_config.temporal_patch_size), "merge_size": merge,
    }))
    return {"processor": {"name": "qwen2_5_image_processor", "transforms": transforms}}


def image_sizes_note(image_processor: Any) -> str:
    lowest, highest = pixel_bounds(image_processor)
    return (f"vision model for images of every size (the runtime's processor resizes each as transformers' does, "
            f"to between {lowest} and {highest} pixels)")


def verification_sizes(model: torch.nn.Module, image_processor: Any) -> tuple[tuple[int, int], ...]:
    return IMAGE_SIZES


def image_bounds(config: Any) -> tuple[int, int]:
    """The tokens before and after an image's tokens: Qwen's vision start and end, GLM-OCR's image start and end."""
    if getattr(config, "vision_start_token_id", None) is not None:
        return int(config.vision_start_token_id), int(config.vision_end_token_id)
    return int(config.image_start_token_id), int(config.image_end_token_id)


def verification_prompt(model: torch.nn.Module, images: dict[str, torch.Tensor]) -> Prompt:
    """Each image's placeholder tokens between a few random text tokens, with the mRoPE positions."""
    config = model.config
    start, end = image_bounds(config)
    text = prompt_text(config, {int(config.image_token_id), int(config.video_token_id), start, end})
    placeholders = []
    for grid in images["image_grid_thw"]:
        tokens = int(grid.prod()) // int(config.vision_config.spatial_merge_size) ** 2
        placeholders += [start, *[int(config.image_token_id)] * tokens, end]
    ids = torch.tensor([text[:3] + placeholders + text[3:8]])
    mm_types = (ids == config.image_token_id).long()
    output = model.model.get_image_features(images["pixel_values"], images["image_grid_thw"])
    features = torch.cat(list(getattr(output, "pooler_output", output)))
    # Qwen3-VL: the DeepStack features beside the merger's, as its vision model gives them (qwen3_vl.py)
    deepstack = [torch.cat(list(blocks)) for blocks in getattr(output, "deepstack_features", None) or []]
    features = torch.cat([features, *deepstack], dim=-1)
    positions, deltas = model.model.get_rope_index(ids, mm_types, image_grid_thw=images["image_grid_thw"],
                                                   attention_mask=torch.ones_like(ids))
    # a text token after the prompt: its position plus the prompt's mRoPE offset, on all 3 axes
    return Prompt(ids, {"pixel_values": images["pixel_values"], "image_grid_thw": images["image_grid_thw"],
                        "mm_token_type_ids": mm_types}, features, positions.numpy(),
                  lambda index: np.full((3, 1, 1), index + int(deltas[0]), dtype=np.int64))


def features_reader(grid_input: str = GRID_INPUT) -> Callable[[Any, dict[str, torch.Tensor]], np.ndarray]:
    """The verification's vision loop for a vision model whose grid input is ``grid_input``."""

    def image_features(vision: Any, images: dict[str, torch.Tensor]) -> np.ndarray:
        """The vision model's features of each image in turn (the runtime's loop), concatenated."""
        features, start = [], 0
        for grid in images["image_grid_thw"]:
            patches = int(grid.prod())
            feed = {"pixel_values": images["pixel_values"][start:start + patches].numpy(), grid_input: grid[None].numpy()}
            features.append(run_session(vision, feed)["image_features"])
            start += patches
        return np.concatenate(features)

    return image_features


def qwen_architecture(
    genai_type: str, vision_model: Callable[[torch.nn.Module], torch.nn.Module], grid_input: str = GRID_INPUT, **fields: Any
) -> VisionLanguageArchitecture:
    """The row of a Qwen vision-language architecture with the vision tower ``vision_model``
    wraps, its grid input named ``grid_input``."""
    return VisionLanguageArchitecture(
        genai_type=genai_type, export_parts=parts_exporter(vision_model, grid_input), vision_section=vision_section,
        processor_config=processor_config, image_sizes_note=image_sizes_note, verification_sizes=verification_sizes,
        verification_prompt=verification_prompt, image_features=features_reader(grid_input), mrope=True, **fields,
    )
