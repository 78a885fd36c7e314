"""The names a transformers model's checkpoint uses for its weights, when they differ from
the model's own.

transformers renames checkpoint keys when it loads them (GPT-NeoX's `embed_out.` is the
model's `lm_head.`; legacy `gamma`/`beta` are `weight`/`bias`) and writes the old names
back in `save_pretrained`. `checkpoint_renaming` gives the same renaming for the weights
of `ONNXProgram.save(model_state=...)`, read from transformers' own table for the
model's class, so that a checkpoint as the hub ships it fits. Only renamings apply:
conversions that change tensors (experts stacked into one tensor) are not done here:
`checkpoint_conversions` names the checkpoint's tensors that need one, for a clear refusal
before a fake-mode export that could not write them.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterable
from typing import Any


def checkpoint_renaming(module: Any) -> Callable[[str], str] | None:
    """checkpoint name -> model name for a transformers model, or None for other models."""
    transformers = sys.modules.get("transformers")
    if transformers is None or not isinstance(module, getattr(transformers, "PreTrainedModel", ())):
        return None
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming, apply_renamings
    except ImportError as error:  # a transformers release without checkpoint renamings
        warnings.warn(
            f"transformers {getattr(transformers, '__version__', '?')} has no checkpoint renaming table "
            f"({error}): model_state names are matched as they are.",
            stacklevel=3,
        )
        return None
    renamings = [t for t in get_model_conversion_mapping(module, add_legacy=True) if isinstance(t, WeightRenaming)]
    if not renamings:
        return None
    return lambda name: apply_renamings(name, renamings)


def checkpoint_conversions(module: Any, names: Iterable[str]) -> dict[str, str]:
    """checkpoint name -> model name of the tensors among ``names`` that transformers converts
    when it loads them (its `WeightConverter`s: per-expert matrices stacked, gate and up
    concatenated) rather than renames; empty for other models and other transformers releases."""
    transformers = sys.modules.get("transformers")
    if transformers is None or not isinstance(module, getattr(transformers, "PreTrainedModel", ())):
        return {}
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter
    except ImportError:  # a release without conversions: checkpoint_renaming has warned of it
        return {}
    converters = [t for t in get_model_conversion_mapping(module, add_legacy=True) if isinstance(t, WeightConverter)]
    if not converters:
        return {}
    rename = checkpoint_renaming(module) or (lambda name: name)
    converted = {}
    for name in names:
        renamed = rename(name)
        for converter in converters:
            target, pattern = converter.rename_source_key(renamed)
            if pattern is not None:
                converted[name] = target
                break
    return converted


__all__ = ["checkpoint_conversions", "checkpoint_renaming"]
