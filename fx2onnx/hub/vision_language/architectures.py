"""The image-text-to-text architectures export-hf writes ONNX Runtime GenAI folders for:
one row per transformers model type, the module that knows the architecture (a new
architecture is a module and a row here)."""

from __future__ import annotations

from typing import Any

from fx2onnx.hub import tasks
from fx2onnx.hub.decoders import text_only
from fx2onnx.hub.vision_language import gemma3, mistral3, qwen2_5_vl, qwen3_vl
from fx2onnx.hub.vision_language.architecture import VisionLanguageArchitecture

ARCHITECTURES: dict[str, VisionLanguageArchitecture] = {
    "qwen2_5_vl": qwen2_5_vl.ARCHITECTURE,
    "qwen3_vl": qwen3_vl.ARCHITECTURE,
    "gemma3": gemma3.ARCHITECTURE,
    "mistral3": mistral3.ARCHITECTURE,
}


def architecture_of(config: Any) -> VisionLanguageArchitecture:
    """The row of ``config``'s model type; a clear error, before anything is written, for a
    model type without one or a configuration its runtime type cannot run."""
    model_type = getattr(config, "model_type", None)
    architecture = ARCHITECTURES.get(model_type)
    if architecture is None:
        raise tasks.UnsupportedArchitectureError(
            f"export-hf writes image-text-to-text folders (ONNX Runtime GenAI's vision, embedding and decoder models) "
            f"for model types {', '.join(ARCHITECTURES)}; {model_type} is not one of them. Nothing was written. "
            f"{text_only.command_hint(config)}"
        )
    try:
        architecture.check(config)
    except NotImplementedError as error:  # the same refusal, naming what works
        raise NotImplementedError(f"{error} {text_only.command_hint(config)}") from error
    return architecture
