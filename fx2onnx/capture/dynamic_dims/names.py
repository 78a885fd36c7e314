"""The names dynamic dims get in ONNX: the user's `Dim("batch")` names where the spec
gives them (a derived Dim, `2*batch`, names the symbol of its root), `<input>_dim_<i>` for the other dims of inputs, `<node>_dim_<i>` for the
data-dependent sizes a node introduces."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from fx2onnx.capture.dynamic_dims.signature import bound_arguments, registered_children


def dim_name(base: str, index: int) -> str:
    """The name of dim ``index`` of the input or node named ``base`` that the user did not name."""
    return f"{base}_dim_{index}"


def _dim_name(spec: Any) -> str | None:
    """The user's name for a dim spec (`Dim("batch")`; a derived Dim, `2*batch`, gives its
    root's), None for AUTO/STATIC/ints."""
    spec = getattr(spec, "root", spec)
    name = getattr(spec, "__name__", None)
    if isinstance(name, str) and type(spec).__name__ not in ("_DimHint", "DimHint"):
        return name
    return None


def _collect_named_dims(value: Any, spec: Any, found: dict[int, dict[int, str]]) -> None:
    if spec is None:
        return
    if isinstance(value, torch.Tensor):
        items = spec.items() if isinstance(spec, Mapping) else enumerate(spec) if isinstance(spec, (list, tuple)) else ()
        names = {int(index): n for index, dim in items if (n := _dim_name(dim)) is not None}
        if names:
            found[id(value)] = names
    elif isinstance(value, Mapping) and isinstance(spec, Mapping):
        for key, item in value.items():
            _collect_named_dims(item, spec.get(key), found)
    elif isinstance(value, (list, tuple)) and isinstance(spec, (list, tuple)):
        for item, item_spec in zip(value, spec):
            _collect_named_dims(item, item_spec, found)
    elif isinstance(spec, (list, tuple)) and (children := registered_children(value)) is not None:
        for item, item_spec in zip(children, spec):
            _collect_named_dims(item, item_spec, found)


def user_dim_names(spec: Any, model: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[int, dict[int, str]]:
    """id(input tensor) -> {dim index: the user's Dim name}."""
    found: dict[int, dict[int, str]] = {}
    if spec is None or spec is True:
        return found
    if isinstance(spec, Mapping):
        named = bound_arguments(model, args, kwargs) or {}
        for key, value in named.items():
            _collect_named_dims(value, spec.get(key), found)
    elif isinstance(spec, (list, tuple)):
        _collect_named_dims([*args, *kwargs.values()], list(spec), found)
    return found


def dim_names_by_position(
    spec: Any, model: Any, args: Sequence[Any], kwargs: Mapping[str, Any], in_spec: pytree.TreeSpec | None
) -> list[dict[int, str]]:
    """For each flat input leaf (in the order of the captured `in_spec`), {dim index: the
    user's Dim name}."""
    names_by_id = user_dim_names(spec, model, args, kwargs)
    if not names_by_id:
        return []
    if in_spec is not None and in_spec.num_children == 2 and in_spec.child(1).context:
        kwargs = {k: kwargs[k] for k in in_spec.child(1).context if k in kwargs}
    leaves, _ = pytree.tree_flatten((tuple(args), dict(kwargs)))
    return [names_by_id.get(id(leaf), {}) for leaf in leaves]
