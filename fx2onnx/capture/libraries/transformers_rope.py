"""transformers' dynamic rotary embeddings, captured as a function of the positions.

A rotary embedding whose ``rope_type`` is dynamic NTK recomputes its inverse frequencies
in forward (``dynamic_rope_update``) when the sequence, ``max(position_ids) + 1``, grows
past the longest it has seen, and keeps them in a buffer: a Python ``if`` on a tensor
value and a state carried from call to call, which torch.export cannot capture and which
a graph captured at one length would freeze. During a capture each such module computes
the frequencies of the step's own length instead, with transformers' own function of
that length (``ROPE_INIT_FUNCTIONS``, which takes it as a tensor), and the module's
undecorated forward reads them. For a sequence that grows, as generation does, that is
what transformers computes at every step; its buffer is left as it was.

LongRoPE needs nothing here: transformers picks its short or long factors with
``torch.where`` on the length, which the graph keeps.

Knows transformers only by name: reads ``transformers.modeling_rope_utils`` from
``sys.modules``, never imports it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

_ROPE_UTILS = "transformers.modeling_rope_utils"


def _rope_types(module: torch.nn.Module) -> list[str]:
    """The module's rope types: one, or one per layer type."""
    rope_type = getattr(module, "rope_type", None)
    if isinstance(rope_type, str):
        return [rope_type]
    return [value for value in rope_type.values() if isinstance(value, str)] if isinstance(rope_type, dict) else []


def _is_dynamic(rope_type: str) -> bool:
    return "dynamic" in rope_type  # transformers' own test in dynamic_rope_update


def dynamic_rotary_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The rotary embeddings of ``model`` whose frequencies depend on the sequence length
    through transformers' ``dynamic_rope_update`` (a decorated forward)."""
    return [
        module for module in model.modules()
        if any(_is_dynamic(kind) for kind in _rope_types(module)) and hasattr(type(module).forward, "__wrapped__")
    ]


def _frequencies_of_the_length(module: torch.nn.Module, init_functions: dict[str, Callable[..., Any]]) -> Callable[..., Any]:
    """A forward for ``module`` that computes its dynamic frequencies from the positions."""
    decorated = type(module).forward
    undecorated = decorated.__wrapped__

    def forward(x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None) -> Any:
        by_layer = {} if layer_type is None else {"layer_type": layer_type}
        rope_type = module.rope_type if layer_type is None else module.rope_type[layer_type]
        if not _is_dynamic(rope_type):
            return decorated(module, x, position_ids, **by_layer)
        length = torch.max(position_ids) + 1  # as dynamic_rope_update measures it
        frequencies, _ = init_functions[rope_type](module.config, x.device, seq_len=length, **by_layer)
        name = "inv_freq" if layer_type is None else f"{layer_type}_inv_freq"
        kept = module._buffers[name]
        module._buffers[name] = frequencies  # read by the undecorated forward, then put back
        try:
            return undecorated(module, x, position_ids, **by_layer)
        finally:
            module._buffers[name] = kept

    return forward


@contextlib.contextmanager
def rope_of_the_sequence_length(model: Any) -> Iterator[None]:
    """For one capture, every dynamic rotary embedding of ``model`` computes its
    frequencies from the step's positions (see the module docstring)."""
    rope_utils = sys.modules.get(_ROPE_UTILS)
    modules = dynamic_rotary_modules(model) if rope_utils is not None and isinstance(model, torch.nn.Module) else []
    for module in modules:
        module.forward = _frequencies_of_the_length(module, rope_utils.ROPE_INIT_FUNCTIONS)
    try:
        yield
    finally:
        for module in modules:
            del module.forward
