"""Qwen2-VL as Transformers.js runs it (ONNX Runtime GenAI has no type for it): its vision
tower with the patch merger for images of any size, full attention within each frame and
the rotary layout computed in the graph (vision_grid.py); its grid input named `grid_thw`,
as Transformers.js's Qwen2VLForConditionalGeneration feeds it; the rest as every Qwen
vision-language model (qwen_images.py)."""

from __future__ import annotations

import torch

from fx2onnx.hub.vision_language import vision_grid
from fx2onnx.hub.vision_language.parts import Holder
from fx2onnx.hub.vision_language.qwen_images import qwen_architecture

GRID_INPUT = "grid_thw"


class Qwen2Vision(torch.nn.Module):
    """Qwen2-VL's vision tower for images of any size: its segments (one per frame) and
    rotary positions computed in the graph from ``grid_thw`` ([images, 3]) and the patch count."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        visual = model.model.visual
        self.model = Holder(visual=visual)
        self.merge = int(visual.config.spatial_merge_size)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> dict[str, torch.Tensor]:
        patches = torch.arange(pixel_values.shape[0], device=pixel_values.device)
        output = self.model.visual(
            pixel_values, grid_thw, position_ids=vision_grid.position_ids(grid_thw, patches, self.merge),
            cu_seqlens=vision_grid.frame_bounds(grid_thw, patches), max_seqlen=0,
        )
        return {"image_features": output.pooler_output}


# genai_type names the model type only: the architecture is in Transformers.js's table alone (transformers_js.py)
ARCHITECTURE = qwen_architecture("qwen2_vl", Qwen2Vision, grid_input=GRID_INPUT)
