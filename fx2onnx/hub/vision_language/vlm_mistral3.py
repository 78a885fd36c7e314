"""Mistral 3 (Pixtral's vision tower, `Mistral3ForConditionalGeneration`) as ONNX Runtime
GenAI's `mistral3` type runs it: a vision model for one image of any size ([1, 3, height,
width], sides multiples of the merged patch; the runtime runs it once per image), the
shared embedding model, and a decoder over `inputs_embeds` with 1-D positions.

The runtime's processor (`processor_transforms`) decodes, resizes with its `smart_resize`,
scales, normalizes, puts channels first and reports each image's size; its prompt
expansion writes each image's `[IMG]` rows ended by `[IMG_BREAK]` and the last by
`[IMG_END]`, as transformers' Pixtral processor does. transformers' processor scales an
image down to fit `size.longest_edge` and rounds each side up to a multiple of the merged
patch; the runtime's `smart_resize` rounds to the nearest multiple instead: an image whose
sides are multiples of the merged patch (and within the longest edge) is left as it is by
both, any other image gets sizes that can differ by one merged patch per side.
"""

from __future__ import annotations

from typing import Any

import torch

from fx2onnx.hub.vision_language.vlm_gemma3 import Holder

GENAI_TYPE = "mistral3"
PROCESSOR_NAME = "pixtral_image_processor"


class PixtralVision(torch.nn.Module):
    """The vision tower and projector (patch merger included) for one image: its size is
    the pixel tensor's, as transformers' `image_sizes` gives it."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        inner = model.model
        self.model = Holder(vision_tower=inner.vision_tower, multi_modal_projector=inner.multi_modal_projector)
        layer = model.config.vision_feature_layer
        self.layers = [layer] if isinstance(layer, int) else list(layer)

    def forward(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        sizes = [(pixel_values.shape[2], pixel_values.shape[3])]
        output = self.model.vision_tower(pixel_values, image_sizes=sizes, output_hidden_states=True, return_dict=True)
        selected = torch.cat([output.hidden_states[index] for index in self.layers], dim=-1)
        return {"image_features": self.model.multi_modal_projector(selected.squeeze(0), sizes)}


def merged_patch(config: Any) -> int:
    """The pixels of one image token's side: the vision patch times the spatial merge."""
    return int(config.vision_config.patch_size) * int(config.spatial_merge_size)


def example_pixels(config: Any) -> torch.Tensor:
    """One image of 2 x 1 image tokens (sides that differ, each past 1), within the tower's
    rotary table (`vision_config.image_size`)."""
    side = merged_patch(config)
    if int(config.vision_config.image_size) < 2 * side:
        raise ValueError(f"vision_config.image_size {config.vision_config.image_size} is under two merged patches ({2 * side}).")
    return torch.randn(1, int(config.vision_config.num_channels), 2 * side, side, generator=torch.Generator().manual_seed(0))


def longest_edge(image_processor: Any) -> int:
    size = getattr(image_processor, "size", None) or {}
    if "longest_edge" not in size:
        raise ValueError(
            f"The image processor ({type(image_processor).__name__}) has no size.longest_edge (size {dict(size)}): "
            "the runtime's Pixtral processor bounds each image by it, as PixtralImageProcessor saves it."
        )
    return int(size["longest_edge"])


def check_image_processor(image_processor: Any, config: Any) -> None:
    """A clear error for an image processor whose resizing the runtime cannot follow."""
    if not getattr(image_processor, "do_resize", True):
        raise ValueError("The image processor does not resize (do_resize is false); the runtime's Pixtral processor always "
                         "does: set do_resize to true in preprocessor_config.json.")
    patch = getattr(image_processor, "patch_size", None) or {}
    patch = patch.get("height") if isinstance(patch, dict) else patch
    side = merged_patch(config)
    if patch is not None and int(patch) not in (side, int(config.vision_config.patch_size)):
        raise ValueError(f"The image processor's patch_size {patch} is neither the vision patch nor the merged patch ({side}).")


def vision_section(config: Any, filename: str, processor_file: str, session: dict[str, Any]) -> dict[str, Any]:
    """genai_config.json's `model.vision` for the runtime's `mistral3` type."""
    return {
        "filename": filename, "config_filename": processor_file, "session_options": session,
        "spatial_merge_size": int(config.spatial_merge_size), "patch_size": int(config.vision_config.patch_size),
        "inputs": {"pixel_values": "pixel_values"}, "outputs": {"image_features": "image_features"},
    }


def processor_transforms(image_processor: Any, patch_size: int, merge_size: int, interpolation: str,
                         scaling: list[dict[str, Any]], operation: Any) -> list[dict[str, Any]]:
    """The runtime's Pixtral transforms: decode to RGB, resize within the longest edge to
    multiples of the merged patch, scale and normalize, channels first, the image sizes."""
    edge, side = longest_edge(image_processor), patch_size * merge_size
    # the decoder gives RGB already: the runtime's ConvertRGB after it would swap the channels
    transforms = [operation("decode_image", "DecodeImage", {"color_space": "RGB"})]
    transforms.append(operation("resize", "Resize", {
        "height": edge, "width": edge, "smart_resize": 1, "min_pixels": side * side, "max_pixels": edge * edge,
        "keep_aspect_ratio": 0, "interpolation": interpolation, "patch_size": patch_size, "merge_size": merge_size,
    }))
    transforms += scaling
    transforms.append(operation("to_channel_first", "Permute3D", {"dims": [2, 0, 1]}))
    transforms.append(operation("pixtral_image_sizes", "PixtralImageSizes"))
    return transforms
