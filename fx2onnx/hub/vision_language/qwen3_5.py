"""Qwen3.5 and Qwen3.5-MoE as Transformers.js runs them (ONNX Runtime GenAI has no type for
them): Qwen3-VL's vision tower without DeepStack (qwen3_vl.py's, for images of any size) and a
hybrid text model, gated delta-rule layers between full-attention ones, whose states the decoder
takes under the names Transformers.js feeds them (`getCacheNames` reads the text config's
`qwen3_5_text` type: decoders/state_names.py). The rest as every Qwen vision-language model
(qwen_images.py).
"""

from __future__ import annotations

from fx2onnx.hub.vision_language.qwen3_vl import Qwen3Vision
from fx2onnx.hub.vision_language.qwen_images import qwen_architecture

# genai_type names the model type only: the architectures are in Transformers.js's table alone (transformers_js.py)
ARCHITECTURE = qwen_architecture("qwen3_5", Qwen3Vision)
MOE_ARCHITECTURE = qwen_architecture("qwen3_5_moe", Qwen3Vision)
