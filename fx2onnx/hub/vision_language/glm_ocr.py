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

from fx2onnx.hub.vision_language.qwen2_vl import Qwen2Vision
from fx2onnx.hub.vision_language.qwen_images import qwen_architecture


class GlmOcrVision(Qwen2Vision):
    """GLM-OCR's vision tower for images of any size, computed as Qwen2-VL's (its segments and
    rotary positions from the grid), its grid input named ``image_grid_thw`` as
    Transformers.js feeds GLM-OCR's."""

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> dict[str, torch.Tensor]:
        return super().forward(pixel_values, image_grid_thw)


# genai_type names the model type only: the architecture is in Transformers.js's table alone (transformers_js.py)
ARCHITECTURE = qwen_architecture("glm_ocr", GlmOcrVision)
