"""Qwen2.5-VL as ONNX Runtime GenAI's `qwen2_5_vl` type runs it: its vision tower with the
patch merger for images of any size, the window and rotary layouts computed in the graph
(vision_grid.py); the rest as every Qwen vision-language model (qwen_images.py)."""

from __future__ import annotations

import torch

from fx2onnx.hub.vision_language import vision_grid
from fx2onnx.hub.vision_language.parts import Holder
from fx2onnx.hub.vision_language.qwen_images import qwen_architecture


class QwenVision(torch.nn.Module):
    """Qwen2.5-VL's vision tower for images of any size: its window and rotary layouts
    computed in the graph from ``image_grid_thw`` ([images, 3]) and the patch count (vision_grid.py)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        visual = model.model.visual
        self.model = Holder(visual=visual)
        config = visual.config
        self.merge = int(config.spatial_merge_size)
        self.window = int(config.window_size) // self.merge // int(config.patch_size)

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> dict[str, torch.Tensor]:
        patches = torch.arange(pixel_values.shape[0], device=pixel_values.device)
        window_index, cu_window_seqlens = vision_grid.window_layout(image_grid_thw, patches, self.merge, self.window)
        output = self.model.visual(
            pixel_values, image_grid_thw, position_ids=vision_grid.position_ids(image_grid_thw, patches, self.merge),
            cu_seqlens=vision_grid.frame_bounds(image_grid_thw, patches), window_index=window_index,
            cu_window_seqlens=cu_window_seqlens, max_seqlen=0, max_window_seqlen=0,
        )
        return {"image_features": output.pooler_output}


ARCHITECTURE = qwen_architecture("qwen2_5_vl", QwenVision)
