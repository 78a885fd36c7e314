"""Dynamic-shape specs for torch.export, and the names their dims get in ONNX."""

from __future__ import annotations

import contextlib
import math
import inspect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import Dim

DynamicShapesOption = bool | Mapping[str, Any] | Sequence[Any] | None


@contextlib.contextmanager
def keep_size_one_dims_dynamic(enabled: bool = True) -> Iterator[None]:
    """Capture with size-oblivious reasoning on backed sizes: torch.export then keeps a
    dynamic dim whose example size is 0 or 1 symbolic instead of specializing it (its
    default "0/1 specialization"). The switch is private to torch: reached here only."""
    if not enabled:
        yield
        return
    import torch.fx.experimental._config as shape_config

    with shape_config.patch(backed_size_oblivious=True), _python_bool_arguments():
        yield


# math functions whose symbolic replacement (torch._sym_<name>) torch.export's graph
# verifier accepts; the others (cos, log2, ...) still fix the dim to its example value
_SYMBOLIC_MATH = ("sqrt",)


@contextlib.contextmanager
def symbolic_math() -> Iterator[None]:
    """`math.sqrt(x.size(1))` in non-strict capture would turn the size into a Python
    float and fix the dim to its example value; torch's drop-in replacements keep it
    symbolic (and call math's own function on plain numbers). Strict capture does the
    same substitution; this does it for the duration of a non-strict capture."""
    originals = {name: getattr(math, name) for name in _SYMBOLIC_MATH}
    try:
        for name, original in originals.items():
            setattr(math, name, _symbolic_or_plain(getattr(torch, f"_sym_{name}"), original))
        yield
    finally:
        for name, function in originals.items():
            setattr(math, name, function)


def _symbolic_or_plain(symbolic: Any, plain: Any) -> Any:
    def function(value: Any) -> Any:
        if isinstance(value, (torch.SymInt, torch.SymFloat)):
            return symbolic(value)
        return plain(value)

    function.__name__ = function.__qualname__ = plain.__name__
    return function


def sound_size_oblivious_capture(program: torch.export.ExportedProgram) -> bool:
    """Whether a size-oblivious capture can be trusted: model code that compared a size-1
    example dim with other sizes leaves a dim bounded above (`VR[1, 2]`) and sizes baked
    into the graph, valid for the example only. Unbounded dims mean nothing was decided
    from the example's 0/1 sizes."""
    for value_range in program.range_constraints.values():
        if not math.isinf(float(value_range.upper)):
            return False
    return True


@contextlib.contextmanager
def _python_bool_arguments() -> Iterator[None]:
    """Size comparisons stay SymBools under size-oblivious reasoning where they used to be
    decided (transformers: `is_causal = q_len > 1 and mask is None`), and
    scaled_dot_product_attention takes only a Python bool: decide it on the way in, which
    records the guard as evaluating it in the model would have."""
    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention

    def attention(*args: Any, **kwargs: Any) -> Any:
        kwargs = {key: bool(value) if isinstance(value, torch.SymBool) else value for key, value in kwargs.items()}
        return original(*args, **kwargs)

    functional.scaled_dot_product_attention = attention
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original


def _all_dims_dynamic(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return {index: Dim.AUTO for index in range(value.dim())}
    if isinstance(value, Mapping):
        return {key: _all_dims_dynamic(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_all_dims_dynamic(item) for item in value)
    children = registered_children(value)
    if children is not None:
        # torch.export reads the spec of a registered container (a KV cache) as a list
        # with one spec per child of its flatten function
        return [_all_dims_dynamic(child) for child in children]
    return None


def registered_children(value: Any) -> list[Any] | None:
    """The children of a value of a registered pytree class (not a builtin container)."""
    node = pytree.SUPPORTED_NODES.get(type(value))
    if node is None or value is None:
        return None
    children, _ = node.flatten_fn(value)
    return list(children)


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
