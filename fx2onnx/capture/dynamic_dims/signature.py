"""How the example inputs bind to forward's parameters, as the capture presents them to
torch.export (keyword inputs that land in ``**kwargs`` become parameters of their own)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree


def registered_children(value: Any) -> list[Any] | None:
    """The children of a value of a registered pytree class (not a builtin container)."""
    node = pytree.SUPPORTED_NODES.get(type(value))
    if node is None or value is None:
        return None
    children, _ = node.flatten_fn(value)
    return list(children)


def forward_signature(model: Any) -> inspect.Signature | None:
    """The signature of an nn.Module's forward or of a function; None when Python has none."""
    target = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def capture_signature(model: Any, kwargs: Mapping[str, Any]) -> inspect.Signature | None:
    """forward's signature as the capture presents it to torch.export, or None when it is
    forward's own.

    A keyword input that lands in forward's ``**kwargs`` (transformers' deprecated
    ``past_key_values=`` after the rename to ``cache``; any ``forward(self, x, **kwargs)``)
    becomes a keyword-only parameter of its own, and ``**kwargs`` is dropped: torch.export
    (2.13, 2.14) rebuilds the bound arguments for its range constraints with such inputs
    both inside ``kwargs`` and at the top level, and no dynamic-shapes spec fits that.
    """
    signature = forward_signature(model)
    if signature is None:
        return None
    parameters = list(signature.parameters.values())
    var_keyword = [p for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD]
    if not var_keyword:
        return None
    named = {p.name for p in parameters if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)}
    extra = [key for key in kwargs if key not in named]
    if not extra:
        return None
    fixed = [p for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD]
    added = [inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=None) for key in extra]
    return signature.replace(parameters=fixed + added)


def bound_arguments(model: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The model's arguments by parameter name, or None when its signature cannot bind them.

    Keyword inputs that land in forward's ``**kwargs`` are named on their own, as in the
    capture (see :func:`capture_signature`)."""
    signature = capture_signature(model, kwargs) or forward_signature(model)
    if signature is None:
        return None
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None
    return dict(bound.arguments)
