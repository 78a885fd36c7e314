"""Dynamic-shape specs for torch.export: built from what the user asked, in the one
place that builds them, for every way inputs bind to forward (`*args`, `**kwargs`)."""

from __future__ import annotations

import contextlib
import inspect
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
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


def sound_size_oblivious_capture(program: torch.export.ExportedProgram, size_one_symbols: set[Any]) -> bool:
    """Whether a size-oblivious capture can be trusted. Model code that compared a size-1
    example dim with other sizes leaves a dim bounded above (`VR[1, 2]`) with sizes baked
    into the graph; and torch's size-oblivious simplification can divide other sizes by
    such a dim (`seq // batch`), which holds for the example only. Either makes the
    capture valid for the example alone: the plain mode is used instead."""
    for value_range in program.range_constraints.values():
        if not math.isinf(float(value_range.upper)):
            return False
    if not size_one_symbols:
        return True
    for node in program.graph_module.graph.nodes:
        for expr in _size_expressions(node.meta.get("val")):
            if _divides_by(expr, size_one_symbols):
                return False
    return True


def model_lines_comparing(program: torch.export.ExportedProgram, symbols: set[Any]) -> list[tuple[str | None, int | None]]:
    """(file, line) of the guards the capture took on ``symbols`` outside torch's own code
    ((None, None) where torch kept no place): where the model's code compared those dims."""
    places = _guard_places(_shape_env(program), symbols)
    return [(filename, line) for filename, line in places if filename is None or not is_torch_file(filename)]


def user_input_nodes(program: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    """The program's placeholders of the user's inputs, in their order (not parameters,
    buffers or constants)."""
    names = set(program.graph_signature.user_inputs)
    return [node for node in program.graph_module.graph.nodes if node.op == "placeholder" and node.name in names]


def size_one_symbols(program: torch.export.ExportedProgram, leaves: Sequence[Any]) -> set[Any]:
    """The symbols of the program's input dims whose example size is 0 or 1."""
    symbols: set[Any] = set()
    user_inputs = user_input_nodes(program)
    for node, leaf in zip(user_inputs, leaves):
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or not isinstance(leaf, torch.Tensor):
            continue
        for size, example in zip(value.shape, leaf.shape):
            if isinstance(size, torch.SymInt) and example in (0, 1):
                symbols |= size.node.expr.free_symbols
    return symbols


def _size_expressions(value: Any) -> list[Any]:
    sizes = list(value.shape) if isinstance(value, torch.Tensor) else [value]
    return [size.node.expr for size in sizes if isinstance(size, (torch.SymInt, torch.SymFloat))]


def _divides_by(expr: Any, symbols: set[Any]) -> bool:
    import sympy

    for term in sympy.preorder_traversal(expr):
        if type(term).__name__ in ("FloorDiv", "CleanDiv", "CeilDiv", "Mod", "PythonMod") and len(term.args) == 2:
            if term.args[1].free_symbols & symbols:
                return True
    return False


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
    location: tuple[str, int] | None  # (file, line) of the code that fixed it
    explicit: bool  # the user named it (Dim("batch"), Dim.DYNAMIC), not only AUTO

    def describe(self) -> str:
        where = f" by the code at {self.location[0]}:{self.location[1]}" if self.location else ""
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


def _walk_spec(value: Any, spec: Any, path: str, found: dict[int, tuple[str, dict[int, bool]]]) -> None:
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
        found[id(value)] = (path, dims)
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
) -> dict[int, tuple[str, dict[int, bool]]]:
    """id(input tensor) -> (its path, {dim: named or Dim.DYNAMIC}) for each dim the spec
    makes dynamic; checks that every dim index fits its tensor. With `explicit=False`
    (dynamic_shapes=True) no dim counts as named."""
    found: dict[int, tuple[str, dict[int, bool]]] = {}
    if spec is None:
        return found
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
    if not explicit:
        found = {key: (path, dict.fromkeys(dims, False)) for key, (path, dims) in found.items()}
    return found


def _shape_env(program: torch.export.ExportedProgram) -> Any:
    for node in program.graph_module.graph.nodes:
        value = node.meta.get("val")
        mode = getattr(value, "fake_mode", None)
        if mode is not None and mode.shape_env is not None:
            return mode.shape_env
    return None


def _source_name(source: Any) -> str:
    name = source.name
    return name() if callable(name) else str(name)


def is_torch_file(filename: str) -> bool:
    return f"{os.sep}torch{os.sep}" in filename


def _fixing_location(shape_env: Any, path: str, dim: int) -> tuple[tuple[str, int] | None, bool]:
    """Where the capture fixed `path`'s dim `dim`: the first guard on its symbol, and
    whether that guard comes from the model's code (not torch's own shape rules)."""
    if shape_env is None:
        return None, True
    wanted = f"L['{path.split('[')[0]}']{path[len(path.split('[')[0]):]}.size()[{dim}]"
    symbols = [
        symbol for symbol, sources in shape_env.var_to_sources.items()
        if any(_source_name(source) == wanted for source in sources)
    ]
    for filename, line in _guard_places(shape_env, set(symbols)):
        if filename is not None:
            return (filename, line), not is_torch_file(filename)
    return None, True


def guards_with_places(program: torch.export.ExportedProgram) -> list[tuple[Any, str | None, int | None]]:
    """(condition, file, line) of every guard the capture took on the inputs' sizes
    ((None, None) where torch kept no place)."""
    return _guards(_shape_env(program))


def _guards(shape_env: Any) -> list[tuple[Any, str | None, int | None]]:
    if shape_env is None:
        return []
    found = []
    for guard in shape_env.guards:
        frame = guard.sloc.framework_loc
        found.append((guard.expr, getattr(frame, "filename", None), getattr(frame, "lineno", None)))
    return found


def _guard_places(shape_env: Any, symbols: set[Any]) -> list[tuple[str | None, int | None]]:
    """(file, line) of each guard the capture took on any of ``symbols``, in order
    ((None, None) where torch kept no place)."""
    return [(filename, line) for expr, filename, line in _guards(shape_env) if expr.free_symbols & symbols]


def specialized_dims(
    program: torch.export.ExportedProgram,
    requested: dict[int, tuple[str, dict[int, bool]]],
    leaves: Sequence[Any],
) -> list[SpecializedDim]:
    """The dims asked to be dynamic that are fixed in the captured program. `leaves` are
    the input leaves in the order of the program's user inputs. Dims fixed by torch's
    own shape rules (a matmul with a weight, a cat with a fixed tensor) are left out
    when only Dim.AUTO asked for them: they can only have that size."""
    user_inputs = user_input_nodes(program)
    shape_env = _shape_env(program)
    found: list[SpecializedDim] = []
    for node, leaf in zip(user_inputs, leaves):
        path, dims = requested.get(id(leaf), (None, {}))
        value = node.meta.get("val")
        if path is None or not isinstance(value, torch.Tensor):
            continue
        for dim, explicit in sorted(dims.items()):
            size = value.shape[dim]
            if isinstance(size, torch.SymInt):
                if size.node.maybe_as_int() is None:
                    continue  # still symbolic
                size = size.node.maybe_as_int()
            location, from_model = _fixing_location(shape_env, path, dim)
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
