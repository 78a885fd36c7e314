"""GLM-OCR as Transformers.js runs it (ONNX Runtime GenAI has no type for it): its vision
tower (full attention within each frame, its rotary positions, then a strided convolution
and the patch merger) for images of any size, the rotary layout and segments computed in
the graph (vision_grid.py); its prompts' images between `image_start_token_id` and
`image_end_token_id`; the rest as every Qwen vision-language model (qwen_images.py).
Transformers.js's GlmOcrForConditionalGeneration computes its own mRoPE positions (an
image's tokens grouped by their id, the text after it advanced by the grid's longer side),
which are transformers' for images (one frame each).
"""

from __future__ import annotations

import torch

from fx2onnx.hub.vision_language import vision_grid
from fx2onnx.hub.vision_language.parts import Holder
from fx2onnx.hub.vision_language.qwen_images import qwen_architecture


class GlmOcrVision(torch.nn.Module):
    """GLM-OCR's vision tower for images of any size: its segments (one per frame) and
    rotary positions computed in the graph from ``image_grid_thw`` ([images, 3]) and the patch count."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        visual = model.model.visual
        self.model = Holder(visual=visual)
        self.merge = int(visual.config.spatial_merge_size)

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> dict[str, torch.Tensor]:
        patches = torch.arange(pixel_values.shape[0], device=pixel_values.device)
        output = self.model.visual(
            pixel_values, image_grid_thw, position_ids=vision_grid.position_ids(image_grid_thw, patches, self.merge),
            cu_seqlens=vision_grid.frame_bounds(image_grid_thw, patches), max_seqlen=0,
        )
        return {"image_features": output.pooler_output}


# genai_type names the model type only: the architecture is in Transformers.js's table alone (transformers_js.py)
ARCHITECTURE = qwen_architecture("glm_ocr", GlmOcrVision)
