"""LFM3-VL as Transformers.js runs it (ONNX Runtime GenAI has no type for it): its vision tower
(gated depthwise convolutions over each frame's patch grid between layers of attention within
each frame) and the projector for images of any size (`pixel_values` [patches, channels x
temporal x patch x patch] and `image_grid_thw` [images, 3] -> `image_features` [image tokens,
hidden]), and the shared decoder over `inputs_embeds` with 1-D positions (parts.py) over the
LFM3 text model, whose convolution states take the names Transformers.js feeds
(`past_conv.<layer>`: decoders/state_names.py).

transformers reshapes each frame to its grid with `grid_thw.tolist()` loops; here the layouts
are computed in the graph from the grid's numbers and the patch count (vision_grid.py): the
attention's segments, the rotary positions, and each patch's convolution taps, so the
convolution is a weighted sum of gathered neighbours (zeros outside the frame, as the
convolution's padding gives). The images and their tokens are the Qwen image processor's
(transformers' `Qwen2VLImageProcessor`, Transformers.js's `Lfm3VlImageProcessor`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from torch.export import Dim

import fx2onnx
from fx2onnx.hub.decoders.sliding_window import growing_cache, masks_by_held_tokens
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.shared.verification import run_session
from fx2onnx.hub.vision_language import parts, vision_grid
from fx2onnx.hub.vision_language.architecture import Prompt, VisionLanguageArchitecture, prompt_text, transformers_js_only
from fx2onnx.hub.vision_language.parts import Holder
from fx2onnx.hub.vision_language.qwen_images import (
    GRID_INPUT, IMAGE_SIZES, PACKED_ATTENTION, _packed_attention, example_grid, vision_inputs,
)


def _packed_grouped_attention(module, query, key, value, **kwargs):
    """The packed attention with the key and value heads repeated to the query's (grouped-query attention)."""
    groups = query.shape[1] // key.shape[1]
    return _packed_attention(module, query, key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1),
                             **kwargs)


def short_conv(conv: torch.nn.Module, hidden: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """A gated depthwise convolution layer over the patches, its convolution as the sum of
    each patch's ``taps`` (vision_grid.neighbour_patches) weighted by the kernel."""
    input_gate, output_gate, values = conv.in_proj(hidden).chunk(3, dim=-1)
    gated = input_gate * values
    rows = torch.cat([gated, gated.new_zeros(1, gated.shape[-1])])[taps]  # [patches, taps, channels]
    kernel = conv.spatial_conv.weight.reshape(gated.shape[-1], -1).transpose(0, 1)  # [taps, channels]
    convolved = (rows * kernel).sum(1)
    if conv.spatial_conv.bias is not None:
        convolved = convolved + conv.spatial_conv.bias
    return conv.out_proj(output_gate * convolved)


class Lfm3Vision(torch.nn.Module):
    """The vision tower and projector for images of any size: segments, rotary positions and
    convolution taps computed in the graph from ``image_grid_thw`` and the patch count."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        inner = model.model
        self.model = Holder(vision_tower=inner.vision_tower, multi_modal_projector=inner.multi_modal_projector)
        self.merge = int(inner.vision_tower.config.spatial_merge_size)
        self.kernel = int(inner.vision_tower.config.conv_kernel_size)

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> dict[str, torch.Tensor]:
        tower = self.model.vision_tower
        patches = torch.arange(pixel_values.shape[0], device=pixel_values.device)
        bounds = vision_grid.frame_bounds(image_grid_thw, patches)
        taps = vision_grid.neighbour_patches(image_grid_thw, patches, self.merge, self.kernel)
        hidden = tower.embedding_norm(tower.patch_embed(pixel_values))
        rotary = tower.rotary_pos_emb(hidden, vision_grid.position_ids(image_grid_thw, patches, self.merge))
        for layer in tower.layers:
            normed = layer.operator_norm(hidden)
            if layer.is_attention_layer:
                mixed, _ = layer.self_attn(hidden_states=normed, cu_seqlens=bounds, position_embeddings=rotary, max_seqlen=0)
            else:
                mixed = short_conv(layer.conv, normed, taps)
            hidden = hidden + mixed
            hidden = hidden + layer.feed_forward(layer.ffn_norm(hidden))
        return {"image_features": self.model.multi_modal_projector(hidden)}


def export_parts(loaded: LoadedModel, options: fx2onnx.ExportOptions, image_processor: Any,
                 architecture: VisionLanguageArchitecture) -> dict[str, fx2onnx.ONNXProgram]:
    """The vision model for any number of images of any size, the token embedding alone
    (Transformers.js merges the images) and the decoder."""
    vision_options = dataclasses.replace(
        parts.without_causal_mask(options), dynamic_shapes={"pixel_values": {0: Dim.AUTO}, GRID_INPUT: {0: Dim.AUTO}}
    )
    tower = loaded.model.model.vision_tower
    with parts.attention_implementation(tower.config, PACKED_ATTENTION, _packed_grouped_attention):
        vision = fx2onnx.dynamo_export(Lfm3Vision(loaded.model), **vision_inputs(loaded, example_grid(loaded)),
                                       export_options=vision_options)
    return {"vision": vision, "embedding": parts.export_token_embedding(loaded, options),
            "decoder": export_decoder(loaded, options)}


def export_decoder(loaded: LoadedModel, options: fx2onnx.ExportOptions) -> fx2onnx.ONNXProgram:
    """The shared decoder (parts.py), its sliding-window layers exact at every length as a
    text folder's (sliding_window.py): captured over a cache that grows in every layer, each
    layer's window a part of its mask."""
    text_config = loaded.config.text_config
    language_model = parts.language_model_of(loaded.model)
    inputs = parts.decode_step_over_embeds(loaded, language_model, int(text_config.hidden_size), mrope=False,
                                           cache=growing_cache(text_config))
    with masks_by_held_tokens(language_model):
        return parts.export_decoder(loaded, options, inputs)


def verification_prompt(model: torch.nn.Module, images: dict[str, torch.Tensor]) -> Prompt:
    """Each image's tokens (one per merged block) between random text tokens."""
    config = model.config
    text = prompt_text(config, {int(config.image_token_id), int(config.video_token_id)})
    merge = int(config.vision_config.spatial_merge_size)
    placeholders = []
    for index, grid in enumerate(images["image_grid_thw"]):
        placeholders += [int(config.image_token_id)] * (int(grid.prod()) // merge ** 2) + [text[8 + index % 2]]
    ids = torch.tensor([text[:3] + placeholders + text[3:8]])
    inputs = {"pixel_values": images["pixel_values"], "image_grid_thw": images["image_grid_thw"]}
    features = torch.cat(list(model.model.get_image_features(**inputs).pooler_output))
    return Prompt(ids, inputs, features, np.arange(ids.shape[1], dtype=np.int64)[None],
                  lambda index: np.array([[index]], dtype=np.int64))


def image_features(vision: Any, images: dict[str, torch.Tensor]) -> np.ndarray:
    """The vision model on the prompt's images in one run (Transformers.js's)."""
    feed = {"pixel_values": images["pixel_values"].numpy(), GRID_INPUT: images["image_grid_thw"].numpy()}
    return run_session(vision, feed)["image_features"]


ARCHITECTURE = transformers_js_only(
    "LFM3-VL", export_parts=export_parts, verification_sizes=lambda model, processor: IMAGE_SIZES,
    verification_prompt=verification_prompt, image_features=image_features, mrope=False,
)
