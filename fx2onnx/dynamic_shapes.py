"""Dynamic-shape specs for torch.export, and the names their dims get in ONNX."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.export import Dim

DynamicShapesOption = bool | Mapping[str, Any] | Sequence[Any] | None


def _all_dims_dynamic(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return {index: Dim.AUTO for index in range(value.dim())}
    if isinstance(value, Mapping):
        return {key: _all_dims_dynamic(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_all_dims_dynamic(item) for item in value)
    return None


def bound_arguments(model: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The model's arguments by parameter name, or None when its signature cannot bind them."""
    target = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        bound = inspect.signature(target).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    return dict(bound.arguments)


def torch_export_spec(option: DynamicShapesOption, model: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """What `torch.export.export(dynamic_shapes=...)` gets for an ExportOptions value."""
    if option is None or option is False:
        return None
    if option is True:
        named = bound_arguments(model, args, kwargs)
        if named is not None:
            return {name: _all_dims_dynamic(value) for name, value in named.items()}
        return tuple(_all_dims_dynamic(a) for a in (*args, *kwargs.values()))
    # a torch.export spec, taken as it is
    return option


def _dim_name(spec: Any) -> str | None:
    """The user's name for a dim spec (`Dim("batch")`), None for AUTO/STATIC/ints."""
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
