"""Qwen3-VL's vision and decoder models as ONNX Runtime GenAI's `qwen3_vl` type runs them
(the embedding model is parts.Embedding, as for every architecture here; the processor,
prompt and vision loop are every Qwen's: qwen_images.py).

Qwen3-VL adds DeepStack: features taken after a few vision layers are added, at the
image tokens, to the hidden states after the decoder's first layers. The runtime (0.18)
has no channel for them: it passes the vision model's one `image_features` output to the
embedding model and that model's one `inputs_embeds` output to the decoder, each sized by
`model.decoder.hidden_size` of genai_config.json. So the features ride in wider rows:

- vision (`pixel_values`, `image_grid_thw` -> `image_features` [image tokens,
  hidden x (1 + deepstack layers)]): the merger's features, then each DeepStack merger's,
  side by side. As for Qwen2.5-VL, the grid's layouts (position embedding interpolation,
  rotary positions, segments) are computed in the graph for an image of any size.
- embedding: a text token's row is its embedding then zeros; an image token's is its features row.
- decoder (`inputs_embeds` as wide): the first `hidden` columns are the embeddings, the
  next blocks the DeepStack features added after each early layer (zeros at text tokens:
  adding them leaves the hidden states as transformers' are).

genai_config.json gives the decoder's `hidden_size` as the wide width (genai_files.py),
which the runtime uses only to size these two buffers.
"""

from __future__ import annotations

from typing import Any

import torch

from fx2onnx.hub.vision_language import vision_grid
from fx2onnx.hub.vision_language.parts import Holder
from fx2onnx.hub.vision_language.qwen_images import qwen_architecture


class Qwen3Vision(torch.nn.Module):
    """Qwen3-VL's vision tower for images of any size, DeepStack features beside the
    merger's: its position-embedding taps, rotary positions and segments computed in the
    graph from ``image_grid_thw`` ([images, 3]) and the patch count (vision_grid.py)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        visual = model.model.visual
        self.model = Holder(visual=visual)
        if (visual.interpolation_mode, visual.interpolation_align_corners) != ("bilinear", True):
            raise NotImplementedError(
                f"Qwen3-VL's position embeddings are resampled {visual.interpolation_mode} with align_corners="
                f"{visual.interpolation_align_corners}; the exported vision tower resamples bilinear with aligned corners."
            )
        self.merge = int(visual.config.spatial_merge_size)
        self.side = int(visual.num_grid_per_side)

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> dict[str, torch.Tensor]:
        patches = torch.arange(pixel_values.shape[0], device=pixel_values.device)
        indices, weights = vision_grid.interpolation_taps(image_grid_thw, patches, self.merge, self.side)
        output = self.model.visual(
            pixel_values, image_grid_thw, interp_indices=indices, interp_weights=weights, max_seqlen=0,
            position_ids=vision_grid.position_ids(image_grid_thw, patches, self.merge),
            cu_seqlens=vision_grid.frame_bounds(image_grid_thw, patches),
        )
        # Qwen3.5's tower (the same but for DeepStack) gives the merger's features alone
        deepstack = getattr(output, "deepstack_features", None) or []
        return {"image_features": torch.cat([output.pooler_output, *deepstack], dim=-1)}


def _added(hidden_states: torch.Tensor, visual_pos_masks: Any, visual_embeds: torch.Tensor) -> torch.Tensor:
    """transformers' DeepStack step for features given at every position (zeros at text tokens)."""
    return hidden_states + visual_embeds.to(hidden_states.dtype)


class DeepStackRows:
    """The DeepStack feature blocks in the rows after the embeddings, one text hidden size each."""

    def extra_width(self, config: Any) -> int:
        return int(config.text_config.hidden_size) * len(config.vision_config.deepstack_visual_indexes)

    def split(self, language_model: torch.nn.Module, inputs_embeds: torch.Tensor, hidden: int) -> tuple[torch.Tensor, dict[str, Any]]:
        """The embeddings of wide ``inputs_embeds`` rows and the language model's DeepStack
        arguments; the model's masked scatter is swapped for an addition at every position
        until ``restore`` (a boolean mask's scatter has a data-dependent size)."""
        main, *deepstack = inputs_embeds.split(hidden, dim=-1)
        language_model._deepstack_process = _added  # an instance attribute: shadows the method
        return main, {"deepstack_visual_embeds": deepstack, "visual_pos_masks": None}

    def restore(self, language_model: torch.nn.Module) -> None:
        language_model.__dict__.pop("_deepstack_process", None)


ARCHITECTURE = qwen_architecture("qwen3_vl", Qwen3Vision, wide_rows=DeepStackRows())
# genai_type names the model type only: ONNX Runtime GenAI has no Qwen3-VL-MoE type; the architecture is in
# Transformers.js's table alone (transformers_js.py)
MOE_ARCHITECTURE = qwen_architecture("qwen3_vl_moe", Qwen3Vision, wide_rows=DeepStackRows())
