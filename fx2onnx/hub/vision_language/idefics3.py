"""Idefics3 and SmolVLM as Transformers.js runs them (ONNX Runtime GenAI has no type for
them): a vision model over a prompt's crops (`pixel_values` [batch, crops, 3, side, side]
and the bool `pixel_attention_mask` [batch, crops, side, side] -> `image_features` [rows,
hidden]: each crop's patches masked as the mask says, the connector's pixel shuffle and
projection, the crops' rows in order), and the shared decoder over `inputs_embeds` with 1-D
positions (parts.py; the language model is the checkpoint's `model.text_model`).

The image processor cuts each image into crops of `max_image_size` plus the whole image
resized to it, so every crop has the vision tower's side; the connector's pixel shuffle
reads a square patch grid, so the side is the model's one size. Crops of zeros (a batch of
prompts with fewer images pads with them) give no rows, as transformers drops them.
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
from fx2onnx.hub.vision_language import parts
from fx2onnx.hub.vision_language.architecture import Prompt, VisionLanguageArchitecture, prompt_text, transformers_js_only
from fx2onnx.hub.vision_language.parts import Holder


class CropVision(torch.nn.Module):
    """The vision tower and connector over a batch of prompts' crops, as rows."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        inner = model.model
        self.model = Holder(vision_model=inner.vision_model, connector=inner.connector)
        self.patch = int(model.config.vision_config.patch_size)

    def forward(self, pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        crops = pixel_values.reshape(-1, *pixel_values.shape[2:])
        mask = pixel_attention_mask.reshape(-1, *pixel_attention_mask.shape[2:]).to(torch.bool)
        count, height, width = mask.shape
        # a patch attends where any of its pixels is an image's (transformers' unfold and sum)
        patches = mask.reshape(count, height // self.patch, self.patch, width // self.patch, self.patch).any(4).any(2)
        hidden = self.model.vision_model(pixel_values=crops, patch_attention_mask=patches, return_dict=True).last_hidden_state
        features = self.model.connector(hidden)
        real = (crops != 0).reshape(count, -1).any(-1)  # a crop of zeros pads a prompt with fewer images
        return {"image_features": features[real].reshape(-1, features.shape[-1])}


def crop_side(config: Any) -> int:
    return int(config.vision_config.image_size)


def check_image_processor(image_processor: Any, config: Any) -> None:
    """A clear error for an image processor whose crops are not the vision tower's side."""
    side = (getattr(image_processor, "max_image_size", None) or {}).get("longest_edge")
    if side != crop_side(config):
        raise ValueError(
            f"The image processor's max_image_size.longest_edge is {side}, the vision tower's image_size "
            f"{crop_side(config)}: the vision model takes crops of the tower's side, as the released processors cut them. "
            "Set max_image_size.longest_edge to vision_config.image_size in preprocessor_config.json."
        )


def export_parts(loaded: LoadedModel, options: fx2onnx.ExportOptions, image_processor: Any,
                 architecture: VisionLanguageArchitecture) -> dict[str, fx2onnx.ONNXProgram]:
    """The vision model for any number of prompts and crops of the tower's side, then the shared parts."""
    config = loaded.config
    check_image_processor(image_processor, config)
    side = crop_side(config)
    channels = int(config.vision_config.num_channels)
    pixels = torch.randn(2, 3, channels, side, side, generator=torch.Generator().manual_seed(0))
    pixels[1, 2] = 0  # a padding crop
    mask = torch.ones(2, 3, side, side, dtype=torch.bool)
    mask[1, 2] = False
    mask[0, 1, :, side // 2:] = False  # a crop padded on the right
    vision_options = dataclasses.replace(
        parts.without_causal_mask(options),
        dynamic_shapes={"pixel_values": {0: Dim.AUTO, 1: Dim.AUTO}, "pixel_attention_mask": {0: Dim.AUTO, 1: Dim.AUTO}},
    )
    example = parts.as_loaded({"pixel_values": pixels, "pixel_attention_mask": mask}, loaded)
    vision = fx2onnx.dynamo_export(CropVision(loaded.model), **example, export_options=vision_options)
    return parts.export_text_parts(loaded, options, architecture, {"vision": vision})


def verification_sizes(model: torch.nn.Module, image_processor: Any) -> tuple[tuple[int, int], ...]:
    """One image of another aspect ratio than the crops', cut into several."""
    side = crop_side(model.config)
    return ((side + 13, 2 * side - 5),)


def verification_prompt(model: torch.nn.Module, images: dict[str, torch.Tensor]) -> Prompt:
    """Each crop's image tokens (one per feature row) between random text tokens."""
    config = model.config
    text = prompt_text(config, {int(config.image_token_id)})
    output = model.model.get_image_features(images["pixel_values"], images["pixel_attention_mask"])
    features = torch.cat(list(output.pooler_output))
    ids = torch.tensor([text[:3] + [int(config.image_token_id)] * features.shape[0] + text[3:8]])
    return Prompt(ids, {"pixel_values": images["pixel_values"], "pixel_attention_mask": images["pixel_attention_mask"]},
                  features, np.arange(ids.shape[1], dtype=np.int64)[None], lambda index: np.array([[index]], dtype=np.int64))


def image_features(vision: Any, images: dict[str, torch.Tensor]) -> np.ndarray:
    """The vision model on the prompt's crops in one run (Transformers.js's)."""
    feed = {"pixel_values": images["pixel_values"].numpy(), "pixel_attention_mask": images["pixel_attention_mask"].bool().numpy()}
    return run_session(vision, feed)["image_features"]


ARCHITECTURE = transformers_js_only(
    "Idefics3 or SmolVLM", export_parts=export_parts, verification_sizes=verification_sizes, verification_prompt=verification_prompt,
    image_features=image_features, mrope=False,
)
