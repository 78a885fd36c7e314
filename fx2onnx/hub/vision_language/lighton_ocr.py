"""LightOnOCR as Transformers.js runs it (ONNX Runtime GenAI has no type for it): Mistral 3's
layout (mistral3.py) with its own module names: a Pixtral vision encoder (`vision_encoder`,
its last hidden state) and a projector (`vision_projection`: norm, patch merger, MLP) for one
image of any size ([1, 3, height, width], sides multiples of the merged patch), the shared
decoder over `inputs_embeds` with 1-D positions (parts.py). Transformers.js's
LightOnOcrForConditionalGeneration is its LlavaForConditionalGeneration: it runs the vision
model on `pixel_values` alone and puts the rows into the image tokens' rows in order.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.export import Dim

import fx2onnx
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.vision_language import mistral3, parts
from fx2onnx.hub.vision_language.architecture import VisionLanguageArchitecture, transformers_js_only
from fx2onnx.hub.vision_language.parts import Holder


class LightOnOcrVision(torch.nn.Module):
    """The vision encoder and projector for one image, its size the pixel tensor's."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        inner = model.model
        self.model = Holder(vision_encoder=inner.vision_encoder, vision_projection=inner.vision_projection)

    def forward(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        sizes = [(pixel_values.shape[2], pixel_values.shape[3])]
        hidden = self.model.vision_encoder(pixel_values, image_sizes=sizes, return_dict=True).last_hidden_state
        return {"image_features": self.model.vision_projection(hidden.squeeze(0), sizes)}


def export_parts(loaded: LoadedModel, options: fx2onnx.ExportOptions, image_processor: Any,
                 architecture: VisionLanguageArchitecture) -> dict[str, fx2onnx.ONNXProgram]:
    """The vision model for one image [1, 3, height, width] of any size, then the shared parts."""
    config = loaded.config
    mistral3.check_image_processor(image_processor, config)
    vision_options = dataclasses.replace(
        parts.without_causal_mask(options), dynamic_shapes={"pixel_values": {2: Dim.AUTO, 3: Dim.AUTO}}
    )
    pixels = parts.as_loaded(mistral3.example_pixels(config), loaded)
    vision = fx2onnx.dynamo_export(LightOnOcrVision(loaded.model), pixel_values=pixels, export_options=vision_options)
    return parts.export_text_parts(loaded, options, architecture, {"vision": vision})


# the verification's images, prompt and vision loop are Mistral 3's (the same Pixtral path)
ARCHITECTURE = transformers_js_only(
    "LightOnOCR", export_parts=export_parts, verification_sizes=mistral3.verification_sizes,
    verification_prompt=mistral3.verification_prompt, image_features=mistral3.image_features, mrope=False,
)
