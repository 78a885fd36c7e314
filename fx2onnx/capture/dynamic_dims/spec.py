"""Dynamic-shape specs for torch.export: built from what the user asked, in the one
place that builds them, for every way inputs bind to forward (`*args`, `**kwargs`)."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import Dim

from fx2onnx.capture.dynamic_dims.guards import SourcePlace, fixing_location, user_input_nodes
from fx2onnx.capture.dynamic_dims.signature import bound_arguments, capture_signature, forward_signature, registered_children
from fx2onnx.capture.library_adapters import registered_containers

DynamicShapesOption = bool | Mapping[str, Any] | Sequence[Any] | None


def _all_dims_dynamic(value: Any, ones_static: bool = False) -> Any:
    if isinstance(value, torch.Tensor):
        return {index: Dim.AUTO for index in range(value.dim()) if not (ones_static and value.shape[index] == 1)}
    if isinstance(value, Mapping):
        return {key: _all_dims_dynamic(item, ones_static) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_all_dims_dynamic(item, ones_static) for item in value)
    children = registered_children(value)
    if children is not None:
        # torch.export reads the spec of a registered container (a KV cache) as a list
        # with one spec per child of its flatten function
        return [_all_dims_dynamic(child, ones_static) for child in children]
    return None


def dims_dynamic_but_ones(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """A spec keyed by input name: every dim of the inputs dynamic (Dim.AUTO, as with
    dynamic_shapes=True) but those of example size 1, static. For an example whose varying
    dims are all 2 or more, a dim of 1 is a size the model gives (one key/value head):
    asked dynamic, it would be captured first from the example grown to 2 there, which the
    model's code refuses, before the capture of the example fixes it to 1 anyway."""
    with registered_containers():  # a cache's spec is one per child, as the capture flattens it
        return {name: _all_dims_dynamic(value, ones_static=True) for name, value in inputs.items()}


def torch_export_spec(option: DynamicShapesOption, model: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """What `torch.export.export(dynamic_shapes=...)` gets for an ExportOptions value."""
    if option is None or option is False:
        return None
    if option is True:
        named = bound_arguments(model, args, kwargs)
        if named is not None:
            return {name: _all_dims_dynamic(value) for name, value in named.items()}
        return tuple(_all_dims_dynamic(a) for a in (*args, *kwargs.values()))
    if isinstance(option, Mapping):
        return _spread_var_keyword_spec(option, model, args, kwargs)
    # a torch.export spec, taken as it is
    return option


def _spread_var_keyword_spec(spec: Mapping[str, Any], model: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A spec written for forward's own signature (``{"kwargs": {"past_key_values": ...}}``,
    torch.export's form for inputs in ``**kwargs``) in the form of the capture's signature
    (``{"past_key_values": ...}``); a spec already in that form is taken as it is. Inputs
    given to the model that a spec with keyword-only inputs leaves out are static."""
    signature = forward_signature(model)
    spec = dict(spec)
    if signature is None or capture_signature(model, kwargs) is None:
        return spec
    for parameter in signature.parameters.values():
        nested = spec.get(parameter.name)
        if parameter.kind is inspect.Parameter.VAR_KEYWORD and isinstance(nested, Mapping) and parameter.name not in kwargs:
            del spec[parameter.name]
            spec.update(nested)
    # torch.export wants every input named; forward's signature does not show these ones
    for name in bound_arguments(model, args, kwargs) or {}:
        spec.setdefault(name, None)
    return spec


# -- dims asked to be dynamic that the capture fixed ----------------------------------
class DynamicDimError(ValueError):
    """A dynamic-shapes spec that does not fit the inputs, or a dim asked to be dynamic
    that the model's code fixes to its example size."""


@dataclass(frozen=True)
class SpecializedDim:
    """A dim asked to be dynamic that torch.export fixed to `value`, and where."""

    input_name: str
    dim: int
    value: int
    location: SourcePlace | None  # the code that fixed it
    explicit: bool  # the user named it (Dim("batch"), Dim.DYNAMIC), not only AUTO

    def describe(self) -> str:
        where = f" by the code at {self.location}" if self.location else ""
        if self.location is None and self.value in (0, 1):
            where = " (torch.export fixes example sizes 0 and 1 when the model's code compares them; export with an example size of 2 or more there)"
        return f"dim {self.dim} of input '{self.input_name}' was fixed to {self.value}{where}"


def _requested(dim_spec: Any) -> bool | None:
    """True for a dim the user asked to be dynamic by name or Dim.DYNAMIC, False for
    Dim.AUTO, None for static."""
    if dim_spec is None or isinstance(dim_spec, int):
        return None
    hint = getattr(dim_spec, "type", None)
    kind = getattr(hint, "name", None)
    if type(dim_spec).__name__ in ("_DimHint", "DimHint"):
        return {"DYNAMIC": True, "AUTO": False}.get(kind)
    return True  # a named Dim


def _dim_items(spec: Any) -> list[tuple[int, Any]]:
    if isinstance(spec, Mapping):
        return [(int(k), v) for k, v in spec.items()]
    if isinstance(spec, (list, tuple)):
        return list(enumerate(spec))
    return []


@dataclass(frozen=True)
class RequestedInput:
    """An example input tensor whose dims the spec makes dynamic."""

    tensor: torch.Tensor
    path: str  # how reports name it: `x`, `cache[0]`
    dims: Mapping[int, bool]  # dim -> named (`Dim("batch")`, `Dim.DYNAMIC`) rather than only Dim.AUTO


class RequestedDims:
    """The example's input tensors whose dims the spec makes dynamic, found by the tensor
    itself (the same object, not an equal one)."""

    def __init__(self, inputs: Iterable[RequestedInput] = ()) -> None:
        self._by_tensor: dict[int, RequestedInput] = {}
        for item in inputs:  # a tensor given twice: its last place, as torch.export reads the spec
            self._by_tensor[id(item.tensor)] = item

    def of(self, value: Any) -> RequestedInput | None:
        """What is asked of ``value``'s dims, None when it is no input tensor of the spec."""
        return self._by_tensor.get(id(value)) if isinstance(value, torch.Tensor) else None

    def __iter__(self) -> Iterator[RequestedInput]:
        return iter(self._by_tensor.values())

    def __len__(self) -> int:
        return len(self._by_tensor)

    def only_auto(self) -> RequestedDims:
        """The same dims, none counting as named (`dynamic_shapes=True`)."""
        return RequestedDims(RequestedInput(item.tensor, item.path, dict.fromkeys(item.dims, False)) for item in self)


def _walk_spec(value: Any, spec: Any, path: str, found: list[RequestedInput]) -> None:
    if spec is None:
        return
    if isinstance(value, torch.Tensor):
        dims = {}
        for index, dim_spec in _dim_items(spec):
            if index >= value.dim() or index < -value.dim():
                raise DynamicDimError(
                    f"dynamic_shapes gives dim {index} of input '{path}', which has only {value.dim()} dims "
                    f"(shape {tuple(value.shape)}): use a dim index from 0 to {value.dim() - 1}."
                )
            requested = _requested(dim_spec)
            if requested is not None:
                dims[index % value.dim()] = requested
        found.append(RequestedInput(value, path, dims))
    elif isinstance(value, Mapping) and isinstance(spec, Mapping):
        for key, item in value.items():
            _walk_spec(item, spec.get(key), f"{path}['{key}']", found)
    elif isinstance(value, (list, tuple)) and isinstance(spec, (list, tuple)):
        for index, (item, item_spec) in enumerate(zip(value, spec)):
            _walk_spec(item, item_spec, f"{path}[{index}]", found)
    elif isinstance(spec, (list, tuple)) and (children := registered_children(value)) is not None:
        for index, (item, item_spec) in enumerate(zip(children, spec)):
            _walk_spec(item, item_spec, f"{path}[{index}]", found)


def requested_dynamic_dims(
    spec: Any, model: Any, args: Sequence[Any], kwargs: Mapping[str, Any], *, explicit: bool
) -> RequestedDims:
    """Each input tensor the spec covers, its path and {dim: named or Dim.DYNAMIC} for
    each dim the spec makes dynamic; checks that every dim index fits its tensor. With
    `explicit=False` (dynamic_shapes=True) no dim counts as named."""
    found: list[RequestedInput] = []
    if spec is None:
        return RequestedDims()
    named = bound_arguments(model, args, kwargs)
    if isinstance(spec, Mapping) and named is not None:
        unknown = sorted(set(spec) - set(named))
        if unknown:
            raise DynamicDimError(
                f"dynamic_shapes names {unknown}, which are not inputs given to the model; "
                f"its inputs are {sorted(named)}."
            )
        for key, value in named.items():
            _walk_spec(value, spec.get(key), key, found)
    elif isinstance(spec, (list, tuple)):
        values = list(named.values()) if named is not None else [*args, *kwargs.values()]
        names = list(named) if named is not None else [str(i) for i in range(len(values))]
        for name, value, item_spec in zip(names, values, spec):
            _walk_spec(value, item_spec, name, found)
    requested = RequestedDims(found)
    return requested if explicit else requested.only_auto()


def specialized_dims(
    program: torch.export.ExportedProgram,
    requested: RequestedDims,
    leaves: Sequence[Any],
) -> list[SpecializedDim]:
    """The dims asked to be dynamic that are fixed in the captured program. `leaves` are
    the input leaves in the order of the program's user inputs. Dims fixed by torch's
    own shape rules (a matmul with a weight, a cat with a fixed tensor) are left out
    when only Dim.AUTO asked for them: they can only have that size."""
    user_inputs = user_input_nodes(program)
    found: list[SpecializedDim] = []
    for node, leaf in zip(user_inputs, leaves):
        asked = requested.of(leaf)
        value = node.meta.get("val")
        if asked is None or not isinstance(value, torch.Tensor):
            continue
        path = asked.path
        for dim, explicit in sorted(asked.dims.items()):
            size = value.shape[dim]
            if isinstance(size, torch.SymInt):
                if size.node.maybe_as_int() is None:
                    continue  # still symbolic
                size = size.node.maybe_as_int()
            location, from_model = fixing_location(program, path, dim)
            if location is None and size not in (0, 1):
                from_model = False  # no guard of the model's: a size torch's rules imply
            if explicit or from_model:
                found.append(SpecializedDim(path, dim, int(size), location, explicit))
    return found


def relaxed_spec(spec: Any) -> Any:
    """The spec with every dynamic dim as Dim.AUTO: torch.export then fixes the dims the
    model's code fixes instead of failing, which tells where that happens."""
    if isinstance(spec, Mapping):
        return {key: relaxed_spec(value) for key, value in spec.items()}
    if isinstance(spec, (list, tuple)):
        return type(spec)(relaxed_spec(value) for value in spec)
    return Dim.AUTO if _requested(spec) is not None else spec
