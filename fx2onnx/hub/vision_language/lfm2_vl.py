"""LFM2-VL as Transformers.js runs it (ONNX Runtime GenAI has no type for it): a vision model
over a prompt's tiles as the image processor lays them out (`pixel_values` [tiles, patches,
channels x patch x patch], each tile's patches in rows and padded to one length, the
`pixel_attention_mask` [tiles, patches] of its real patches and the `spatial_shapes`
[tiles, 2] of its patch grid -> `image_features` [image tokens, hidden]), and the shared decoder
over `inputs_embeds` with 1-D positions (parts.py) over the LFM2 text model, whose convolution
states take the names Transformers.js feeds (`past_conv.<layer>`: decoders/state_names.py).

Each image token is a `downsample_factor` x `downsample_factor` block of a tile's patch grid,
the blocks in rows: the vision model gathers each block's patches (a tile's padding patches
give no token), concatenates them as transformers' projector unshuffles them, and projects
them; the tokens of the prompt's tiles follow each other in order, as Transformers.js puts
them into the image tokens' rows.

transformers' Lfm2VlImageProcessor needs torchvision; the export reads no image processor,
and the verification feeds the vision model random pixel patches in the processor's layout
(two tiles of different grids, padded to one length) rather than images.
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

INPUTS = ("pixel_values", "pixel_attention_mask", "spatial_shapes")


class TileVision(torch.nn.Module):
    """The SigLIP2 tower and the projector over a prompt's tiles, as image-token rows."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        inner = model.model
        self.model = Holder(vision_tower=inner.vision_tower, multi_modal_projector=inner.multi_modal_projector)
        self.factor = int(model.config.downsample_factor)

    def forward(self, pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor,
                spatial_shapes: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.model.vision_tower(pixel_values=pixel_values, pixel_attention_mask=pixel_attention_mask,
                                         spatial_shapes=spatial_shapes, return_dict=True).last_hidden_state
        tiles, patches, channels = hidden.shape
        factor = self.factor
        widths = spatial_shapes[:, 1:2]  # [tiles, 1]: patches per grid row
        per_row = widths // factor  # tokens per row of blocks
        tokens = (spatial_shapes[:, 0:1] // factor) * per_row
        token = torch.arange(patches // (factor * factor), device=hidden.device)[None]  # [1, slots]
        step = torch.arange(factor, device=hidden.device)
        # the patch of each block's (row, column) offset, as an index into the tile's rows of patches
        rows = (token // per_row * factor)[..., None, None] + step[:, None]
        columns = (token % per_row * factor)[..., None, None] + step
        real = token < tokens  # [tiles, slots]: the slots past a tile's tokens read its first patch, then dropped
        index = torch.where(real[..., None, None], rows * widths[..., None, None] + columns, 0)
        index = index + torch.arange(tiles, device=hidden.device)[:, None, None, None] * patches
        # a block's patches row by row, each patch's channels together: the order of the projector's unshuffle
        blocks = hidden.reshape(-1, channels)[index.reshape(tiles, -1)].reshape(tiles, -1, factor * factor * channels)
        return {"image_features": project(self.model.multi_modal_projector, blocks[real])}


def project(projector: torch.nn.Module, blocks: torch.Tensor) -> torch.Tensor:
    """The projector on unshuffled blocks (its layers after the unshuffle)."""
    if projector.use_layer_norm:
        blocks = projector.layer_norm(blocks)
    return projector.linear_2(projector.act(projector.linear_1(blocks)))


def patch_width(config: Any) -> int:
    """A patch's values: channels x patch x patch."""
    vision = config.vision_config
    return int(vision.num_channels) * int(vision.patch_size) ** 2


def tiles(config: Any, grids: tuple[tuple[int, int], ...], length: int, seed: int) -> dict[str, torch.Tensor]:
    """Random normalized pixel patches of tiles of ``grids`` (patch rows, patch columns), each
    padded with zeros to ``length`` patches, with their mask and spatial shapes."""
    pixels = torch.zeros(len(grids), length, patch_width(config))
    mask = torch.zeros(len(grids), length, dtype=torch.int64)
    generator = torch.Generator().manual_seed(seed)
    for tile, (height, width) in enumerate(grids):
        pixels[tile, :height * width] = torch.rand(height * width, patch_width(config), generator=generator) * 2 - 1
        mask[tile, :height * width] = 1
    return {"pixel_values": pixels, "pixel_attention_mask": mask, "spatial_shapes": torch.tensor(grids, dtype=torch.int64)}


def verification_grids(config: Any) -> tuple[tuple[int, int], ...]:
    """Two tiles of other grids and aspect ratios (multiples of the downsample factor)."""
    factor = int(config.downsample_factor)
    return (2 * factor, 3 * factor), (3 * factor, factor)


def export_parts(loaded: LoadedModel, options: fx2onnx.ExportOptions, image_processor: Any,
                 architecture: VisionLanguageArchitecture) -> dict[str, fx2onnx.ONNXProgram]:
    """The vision model for any number of tiles and padded length, then the shared parts."""
    config = loaded.config
    factor = int(config.downsample_factor)
    example = tiles(config, ((factor, 2 * factor), (2 * factor, factor)), 3 * factor * factor, seed=0)
    batch, length = Dim.AUTO, Dim.AUTO
    vision_options = dataclasses.replace(parts.without_causal_mask(options), dynamic_shapes={
        "pixel_values": {0: batch, 1: length}, "pixel_attention_mask": {0: batch, 1: length}, "spatial_shapes": {0: batch},
    })
    vision = fx2onnx.dynamo_export(TileVision(loaded.model), **parts.as_loaded(example, loaded), export_options=vision_options)
    return parts.export_text_parts(loaded, options, architecture, {"vision": vision})


def verification_images(model: torch.nn.Module, image_processor: Any) -> dict[str, torch.Tensor]:
    """The vision inputs of the verification: two tiles of other grids, padded past both."""
    grids = verification_grids(model.config)
    return tiles(model.config, grids, max(height * width for height, width in grids) + 4, seed=1)


def verification_prompt(model: torch.nn.Module, images: dict[str, torch.Tensor]) -> Prompt:
    """The tiles' image tokens (one per feature row) between random text tokens."""
    config = model.config
    text = prompt_text(config, {int(config.image_token_id)})
    inputs = {name: images[name] for name in INPUTS}
    output = model.model.get_image_features(**inputs)
    features = torch.cat(list(output.pooler_output))
    ids = torch.tensor([text[:3] + [int(config.image_token_id)] * features.shape[0] + text[3:8]])
    return Prompt(ids, inputs, features, np.arange(ids.shape[1], dtype=np.int64)[None],
                  lambda index: np.array([[index]], dtype=np.int64))


def image_features(vision: Any, images: dict[str, torch.Tensor]) -> np.ndarray:
    """The vision model on the prompt's tiles in one run (Transformers.js's)."""
    return run_session(vision, {name: images[name].numpy() for name in INPUTS})["image_features"]


ARCHITECTURE = transformers_js_only(
    "LFM2-VL", export_parts=export_parts, verification_sizes=lambda model, processor: (),
    verification_prompt=verification_prompt, image_features=image_features, mrope=False,
    verification_images=verification_images, reads_image_processor=False,
)
