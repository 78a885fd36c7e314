"""LLaVA as Transformers.js runs it (ONNX Runtime GenAI has no type for it): a vision model
for images of the vision tower's one size (`pixel_values` [images, 3, size, size] ->
`image_features` [images, tokens, hidden], the hidden states of the configured layers, the
class token dropped by the "default" strategy, through the projector), the shared decoder
over `inputs_embeds` with 1-D positions (parts.py). Transformers.js flattens the features
to rows and puts them into the image tokens' rows in order, as transformers does.
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


class LlavaVision(torch.nn.Module):
    """The vision tower and projector for a batch of images of the tower's size."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        inner, config = model.model, model.config
        self.model = Holder(vision_tower=inner.vision_tower, multi_modal_projector=inner.multi_modal_projector)
        layer = config.vision_feature_layer
        self.layers = [layer] if isinstance(layer, int) else list(layer)
        self.first = 1 if config.vision_feature_select_strategy == "default" else 0  # "default" drops the class token

    def forward(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        output = self.model.vision_tower(pixel_values, output_hidden_states=True, return_dict=True)
        selected = torch.cat([output.hidden_states[index][:, self.first:] for index in self.layers], dim=-1)
        return {"image_features": self.model.multi_modal_projector(selected)}


def full_strategy(config: Any) -> bool:
    """Whether the vision features keep the class token (the "full" strategy), as Transformers.js's
    LlavaProcessor counts an image's tokens (num_additional_image_tokens always among them)."""
    return getattr(config, "vision_feature_select_strategy", "default") == "full"


def image_side(config: Any) -> int:
    return int(config.vision_config.image_size)


def export_vision(vision: torch.nn.Module, loaded: LoadedModel, options: fx2onnx.ExportOptions) -> fx2onnx.ONNXProgram:
    """The program of ``vision`` over any number of images of the tower's size (PaliGemma's too)."""
    config = loaded.config
    side = image_side(config)
    pixels = torch.randn(2, int(config.vision_config.num_channels), side, side, generator=torch.Generator().manual_seed(0))
    vision_options = dataclasses.replace(parts.without_causal_mask(options), dynamic_shapes={"pixel_values": {0: Dim.AUTO}})
    return fx2onnx.dynamo_export(vision, pixel_values=parts.as_loaded(pixels, loaded), export_options=vision_options)


def export_parts(loaded: LoadedModel, options: fx2onnx.ExportOptions, image_processor: Any,
                 architecture: VisionLanguageArchitecture) -> dict[str, fx2onnx.ONNXProgram]:
    """The vision model for any number of images of the tower's size, then the shared parts."""
    vision = export_vision(LlavaVision(loaded.model), loaded, options)
    return parts.export_text_parts(loaded, options, architecture, {"vision": vision})


def verification_sizes(model: torch.nn.Module, image_processor: Any) -> tuple[tuple[int, int], ...]:
    """Two images of other sizes than the tower's (the image processor resizes both to it)."""
    side = image_side(model.config)
    return (side + 10, side + 3), (side // 2 + 1, side + 7)


def verification_prompt(model: torch.nn.Module, images: dict[str, torch.Tensor]) -> Prompt:
    """Each image's tokens (one per feature row) between random text tokens."""
    config = model.config
    text = prompt_text(config, {int(config.image_token_id)})
    output = model.model.get_image_features(images["pixel_values"])
    features = torch.cat(list(output.pooler_output))
    per_image = features.shape[0] // images["pixel_values"].shape[0]
    placeholders = []
    for index in range(images["pixel_values"].shape[0]):
        placeholders += [int(config.image_token_id)] * per_image + [text[8 + index % 2]]
    ids = torch.tensor([text[:3] + placeholders + text[3:8]])
    return Prompt(ids, {"pixel_values": images["pixel_values"]}, features,
                  np.arange(ids.shape[1], dtype=np.int64)[None], lambda index: np.array([[index]], dtype=np.int64))


def image_features(vision: Any, images: dict[str, torch.Tensor]) -> np.ndarray:
    """The vision model on the images in one run, as rows (Transformers.js's view)."""
    features = run_session(vision, {"pixel_values": images["pixel_values"].numpy()})["image_features"]
    return features.reshape(-1, features.shape[-1])


ARCHITECTURE = transformers_js_only(
    "LLaVA", export_parts=export_parts, verification_sizes=verification_sizes, verification_prompt=verification_prompt,
    image_features=image_features, mrope=False,
)
