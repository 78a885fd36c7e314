"""The causal-LM recipe's architectures table: the decoder model types ONNX Runtime GenAI
runs by name with export-hf's layout (one key and one value input per layer), and the
runtime type every other decoder gets."""

from __future__ import annotations

from typing import Any

# Decoder model types ONNX Runtime GenAI 0.18 accepts by name and runs with this layout
# (one key and one value input per layer). It knows `gpt2` too, with GPT-2's former
# layout (one stacked past per layer): GPT-2 gets the generic `decoder`, like the types
# it does not know.
GENAI_MODEL_TYPES = frozenset({
    "chatglm", "ernie4_5", "gemma", "gemma2", "gemma3_text", "gptoss", "granite", "internlm2", "llama",
    "mistral", "nemotron", "olmo", "phi", "phi3", "phi3small", "phimoe", "qwen2", "qwen3", "smollm3",
})
GENERIC_DECODER = "decoder"


def genai_decoder_type(config: Any) -> str:
    """ONNX Runtime GenAI's `model.type` for a decoder of ``config``."""
    model_type = str(getattr(config, "model_type", GENERIC_DECODER))
    return model_type if model_type in GENAI_MODEL_TYPES else GENERIC_DECODER
