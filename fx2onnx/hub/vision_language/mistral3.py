"""Mistral 3 (Pixtral's vision tower, `Mistral3ForConditionalGeneration`) as ONNX Runtime
GenAI's `mistral3` type runs it: a vision model for one image of any size ([1, 3, height,
width], sides multiples of the merged patch; the runtime runs it once per image), the
shared embedding model, and a decoder over `inputs_embeds` with 1-D positions (parts.py).

The runtime's processor (`processor_config`) decodes, resizes with its `smart_resize`,
scales, normalizes, puts channels first and reports each image's size; its prompt
expansion writes each image's `[IMG]` rows ended by `[IMG_BREAK]` and the last by
`[IMG_END]`, as transformers' Pixtral processor does. transformers' processor scales an
image down to fit `size.longest_edge` and rounds each side up to a multiple of the merged
patch; the runtime's `smart_resize` rounds to the nearest multiple instead: an image whose
sides are multiples of the merged patch (and within the longest edge) is left as it is by
both, any other image gets sizes that can differ by one merged patch per side.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from torch.export import Dim

import fx2onnx
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.shared.verification import run_session
from fx2onnx.hub.vision_language import genai_files, parts
from fx2onnx.hub.vision_language.architecture import Prompt, VisionLanguageArchitecture, prompt_text
from fx2onnx.hub.vision_language.parts import Holder

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


def export_parts(loaded: LoadedModel, options: fx2onnx.ExportOptions, image_processor: Any,
                 architecture: VisionLanguageArchitecture) -> dict[str, fx2onnx.ONNXProgram]:
    """The vision model for one image [1, 3, height, width] of any size, then the shared parts."""
    config = loaded.config
    check_image_processor(image_processor, config)
    vision_options = dataclasses.replace(
        parts.without_causal_mask(options), dynamic_shapes={"pixel_values": {2: Dim.AUTO, 3: Dim.AUTO}}
    )
    pixels = parts.as_loaded(example_pixels(config), loaded)
    vision = fx2onnx.dynamo_export(PixtralVision(loaded.model), pixel_values=pixels, export_options=vision_options)
    return parts.export_text_parts(loaded, options, architecture, {"vision": vision})


def vision_section(config: Any, filename: str, processor_file: str) -> dict[str, Any]:
    """genai_config.json's `model.vision` for the runtime's `mistral3` type."""
    return genai_files.vision_section(filename, {
        "spatial_merge_size": int(config.spatial_merge_size), "patch_size": int(config.vision_config.patch_size),
    })


def processor_config(image_processor: Any, config: Any) -> dict[str, Any]:
    """The runtime's Pixtral transforms: decode to RGB, resize within the longest edge to
    multiples of the merged patch, scale and normalize, channels first, the image sizes."""
    patch_size, merge_size = int(config.vision_config.patch_size), int(getattr(config, "spatial_merge_size", None) or 1)
    interpolation = genai_files.interpolation(image_processor)
    edge, side = longest_edge(image_processor), patch_size * merge_size
    transforms = [genai_files.decoded_rgb()]
    transforms.append(genai_files.operation("resize", "Resize", {
        "height": edge, "width": edge, "smart_resize": 1, "min_pixels": side * side, "max_pixels": edge * edge,
        "keep_aspect_ratio": 0, "interpolation": interpolation, "patch_size": patch_size, "merge_size": merge_size,
    }))
    transforms += genai_files.scaling(image_processor)
    transforms.append(genai_files.operation("to_channel_first", "Permute3D", {"dims": [2, 0, 1]}))
    transforms.append(genai_files.operation("pixtral_image_sizes", "PixtralImageSizes"))
    return {"processor": {"name": PROCESSOR_NAME, "transforms": transforms}}


def image_sizes_note(image_processor: Any) -> str:
    return (f"vision model for images of every size up to {longest_edge(image_processor)} pixels a side "
            "(the runtime's processor rounds each side to the nearest multiple of the merged patch, transformers' "
            "rounds up: the same images when the sides are multiples already)")


def verification_sizes(model: torch.nn.Module, image_processor: Any) -> tuple[tuple[int, int], ...]:
    """Two images of different sizes whose sides are multiples of the merged patch (which
    the runtime's resize and transformers' leave as they are), within the rotary table."""
    side = merged_patch(model.config)
    return (2 * side, 3 * side), (3 * side, side)


def verification_prompt(model: torch.nn.Module, images: dict[str, torch.Tensor]) -> Prompt:
    """Each image's rows of image tokens, each row ended by a break token and the last by
    an end token (Pixtral's layout; the two are text tokens here), between random text tokens."""
    config = model.config
    text = prompt_text(config, {int(config.image_token_id)})
    side = merged_patch(config)
    placeholders = []
    for height, width in images["image_sizes"].tolist():
        rows = [[int(config.image_token_id)] * (width // side) + [text[8]] for _ in range(height // side)]
        rows[-1][-1] = text[9]
        placeholders += [token for row in rows for token in row]
    ids = torch.tensor([text[:3] + placeholders + text[3:8]])
    output = model.model.get_image_features(images["pixel_values"], images["image_sizes"])
    features = torch.cat(list(output.pooler_output))
    return Prompt(ids, {"pixel_values": images["pixel_values"], "image_sizes": images["image_sizes"]}, features,
                  np.arange(ids.shape[1], dtype=np.int64)[None], lambda index: np.array([[index]], dtype=np.int64))


def image_features(vision: Any, images: dict[str, torch.Tensor]) -> np.ndarray:
    """The vision model on each image at its own size (the runtime's loop), concatenated."""
    pixels = images["pixel_values"]
    return np.concatenate([
        run_session(vision, {"pixel_values": pixels[index:index + 1, :, :height, :width].numpy()})["image_features"]
        for index, (height, width) in enumerate(images["image_sizes"].tolist())
    ])


ARCHITECTURE = VisionLanguageArchitecture(
    genai_type="mistral3", export_parts=export_parts, vision_section=vision_section, processor_config=processor_config,
    image_sizes_note=image_sizes_note, verification_sizes=verification_sizes, verification_prompt=verification_prompt,
    image_features=image_features, mrope=False,
)
