"""What to change when torch.export cannot capture a transformers model.

The generic capture hint speaks of control flow and torch.cond; for a transformers model
the fix is almost always a config flag or an input: turn the cache off, pick another
attention implementation, pass the mask or positions the model would otherwise compute
from tensor values. Knows transformers only by name: nothing here imports it.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

from fx2onnx.capture.value_branches import DATA_DEPENDENT, held_value_advice, value_branch

_ATTENTION_FILES = ("flash_attention", "flex_attention", "paged_attention", "sdpa_attention")
# Longformer's sliding-window attention and LED's copy of it: the files and the functions
# that size its chunks (the files' other captures that read tensor values: its branch on
# whether any token attends globally)
_SLIDING_CHUNK_FILES = ("modeling_longformer.py", "modeling_led.py")
_SLIDING_CHUNK_FUNCTIONS = ("_chunk", "_sliding_chunks_query_key_matmul", "_sliding_chunks_matmul_attn_probs_value")


def _is_transformers_model(model: Any) -> bool:
    return any(cls.__module__.startswith("transformers.") for cls in type(model).__mro__)


def transformers_version(model: Any) -> str | None:
    """transformers' version when `model` is one of its models (the report names it)."""
    transformers = sys.modules.get("transformers")
    return transformers.__version__ if transformers is not None and _is_transformers_model(model) else None


def _transformers_frame(error: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of the traceback inside transformers' sources."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "/transformers/" in f.filename.replace("\\", "/")]
    return frames[-1] if frames else None


def transformers_hint(model: Any, error: BaseException) -> str | None:
    """One sentence naming the config flag or input to change, or None when `model` is
    not a transformers model or the failure is not one of the known kinds."""
    if not _is_transformers_model(model):
        return None
    text = f"{type(error).__name__}: {error}"
    config = getattr(model, "config", None)
    uses_cache = bool(getattr(config, "use_cache", False))
    frame = _transformers_frame(error)
    where = f" (failing in {frame.filename.split('/transformers/')[-1]}:{frame.lineno})" if frame else ""
    unknown_type = "which is not a known type" in text or "register a pytree" in text
    if unknown_type or ("Cache" in text and any(word in text for word in ("pytree", "Node type", "treespec", "flatten"))):
        return (
            f"the model's cache object ({_cache_name(text)}) cannot be an ONNX input or output{where}: "
            "export without it with use_cache=False (model.config.use_cache = False, or pass use_cache=False), "
            "or pass past_key_values as a transformers DynamicCache / EncoderDecoderCache."
        )
    if frame is not None and any(name in frame.filename for name in _ATTENTION_FILES if name != "sdpa_attention"):
        return (
            f"this attention implementation cannot be captured{where}: load or configure the model with "
            "attn_implementation=\"sdpa\" (or \"eager\"), e.g. model.set_attn_implementation(\"sdpa\")."
        )
    # the model's line that read tensor values, quoted (None for another failure)
    data_dependent = any(needle in text for needle in DATA_DEPENDENT)
    branch = value_branch(model, error) if data_dependent else None
    line = f" at {branch}" if branch is not None else where
    # in its attention's file: the chunks' sizes, or the branch on any token attending globally
    if frame is not None and frame.filename.endswith(_SLIDING_CHUNK_FILES) and (
            frame.name in _SLIDING_CHUNK_FUNCTIONS or data_dependent):
        return (
            f"Longformer's sliding-window attention cannot be captured{line}: it counts its chunks with "
            "torch.div on sizes, which makes them tensors that the capture reads back as sizes of unknown value, "
            "and branches on whether any token attends globally (.item()); no input or config flag avoids it."
        )
    if data_dependent:
        if branch is not None and branch.held:  # a value the model holds: no input changes it
            return held_value_advice(branch)
        advice = "pass attention_mask (and position_ids) explicitly instead of letting the model derive them from token values"
        if uses_cache:
            advice += ", or export with use_cache=False"
        return f"transformers code reads tensor values to decide a Python branch{line}: {advice}."
    if uses_cache and frame is not None and "cache" in frame.filename.lower():
        return (
            f"the model's cache handling cannot be captured{where}: export with use_cache=False, "
            "or pass past_key_values as a DynamicCache built by a PyTorch run of the model."
        )
    return None


def _cache_name(text: str) -> str:
    for word in text.replace("'", " ").replace(".", " ").replace(">", " ").split():
        if word.endswith(("Cache", "Layer")):
            return word
    return "a Cache"
