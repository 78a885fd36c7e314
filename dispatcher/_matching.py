"""Signature matching: how well an ONNX function's signature fits an FX node's arguments.

The node's positional arguments bind to the signature's parameters in order (a variadic
input takes the rest), keyword arguments by name. Keyword arguments that carry no data
for ONNX (``layout``, ``device``...) and those whose value is None are dropped first.

Then each bound parameter is checked:

* an input (``onnx_ir.schemas.Parameter``) fits when the argument's ONNX type is one of
  the type constraint's allowed types. A tensor node gives ``tensor(dtype)``, a
  SymInt/SymFloat/SymBool node a 0-d INT64/FLOAT/BOOL tensor, a list of tensor nodes a
  sequence. A Python scalar (or a list of them) becomes a constant whose type the
  evaluator picks later, so it fits when the constraint allows any element type of
  its kind (bool < int < float, as in PyTorch: an int fits a float tensor; a str
  needs STRING). None fits an optional input (including ``Optional[...]`` annotations
  that the signature lost). A node without ``meta["val"]`` is given the benefit of
  the doubt.
* an attribute (``onnx_ir.schemas.AttributeParameter``) fits when the Python value has
  the attribute's type: int/bool/torch.dtype for INT, int/float for FLOAT, str for
  STRING, a list or tuple of those for INTS/FLOATS/STRINGS.

A call that cannot bind at all (too many positional arguments, an unknown keyword, a
required parameter left out) is not a candidate. Otherwise the score is the number of
bound parameters that fit, and the match is perfect when all of them fit.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import onnx_ir as ir
import torch
import torch.fx
from onnx_ir.schemas import AttributeParameter, OpSignature, Parameter, TypeConstraintParam

from dispatcher import _types

# Keyword arguments of ATen operators that say nothing ONNX can use.
DROPPED_KWARGS = frozenset(
    {"layout", "device", "requires_grad", "pin_memory", "memory_format", "implicit", "non_blocking"}
)

# Objects that torchlib declares as STRING attributes (``device: str = ""``).
_STRING_LIKE = (str, torch.device, torch.layout, torch.memory_format)


@dataclasses.dataclass(frozen=True)
class ParameterCheck:
    """Whether one bound argument fits its parameter, with both types spelled out."""

    name: str
    is_attribute: bool
    fits: bool
    got: str
    allowed: str

    def __str__(self) -> str:
        kind = "attribute" if self.is_attribute else "input"
        verdict = "fits" if self.fits else "does not fit"
        return f"{kind} '{self.name}': got {self.got}, allowed {self.allowed}: {verdict}"


@dataclasses.dataclass(frozen=True)
class SignatureMatch:
    """The result of matching one signature against one call."""

    checks: tuple[ParameterCheck, ...] = ()
    # Why the call cannot bind to the signature at all (then there is no score).
    rejected: str | None = None

    @property
    def is_candidate(self) -> bool:
        return self.rejected is None

    @property
    def is_perfect(self) -> bool:
        return self.rejected is None and all(c.fits for c in self.checks)

    @property
    def score(self) -> int | None:
        """Number of bound parameters that fit; None when the call cannot bind."""
        if self.rejected is not None:
            return None
        return sum(c.fits for c in self.checks)

    @property
    def mismatches(self) -> tuple[ParameterCheck, ...]:
        return tuple(c for c in self.checks if not c.fits)

    def summary(self) -> str:
        if self.rejected is not None:
            return f"rejected: {self.rejected}"
        if self.is_perfect:
            return f"perfect match (score {self.score})"
        return f"score {self.score}; " + "; ".join(str(c) for c in self.mismatches)


def clean_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Drop keyword arguments that ONNX ignores and those whose value is None."""
    return {k: v for k, v in kwargs.items() if v is not None and k not in DROPPED_KWARGS}


def match_signature(
    signature: OpSignature | None,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    optional: frozenset[str] = frozenset(),
) -> SignatureMatch:
    """Match an FX call ``(args, kwargs)`` against an ONNX function's signature.

    ``optional`` names parameters that accept None although the signature does not say
    so (``onnx_ir`` drops ``Optional[...]`` from annotations; see
    :func:`optional_parameters`).
    """
    if signature is None:
        return SignatureMatch(rejected="the function has no signature to match against")
    params = list(signature.params)
    bound: dict[str, Any] = {}
    index = 0
    for param in params:
        if index >= len(args):
            break
        if isinstance(param, Parameter) and param.variadic:
            rest = list(args[index:])
            if len(rest) == 1 and isinstance(rest[0], (list, tuple)):
                rest = list(rest[0])
            bound[param.name] = _Variadic(rest)
            index = len(args)
            break
        bound[param.name] = args[index]
        index += 1
    if index < len(args):
        return SignatureMatch(
            rejected=(
                f"takes at most {len(params)} positional arguments "
                f"({', '.join(p.name for p in params) or 'none'}) but {len(args)} were given"
            )
        )
    for name, value in clean_kwargs(kwargs).items():
        if name not in signature.params_map:
            return SignatureMatch(rejected=f"has no parameter named '{name}' (passed {_describe(value)})")
        if name in bound:
            return SignatureMatch(rejected=f"got two values for parameter '{name}'")
        bound[name] = value

    checks = []
    for param in params:
        value = bound.get(param.name)
        if value is None:
            if _is_required(param) and param.name not in optional:
                return SignatureMatch(rejected=f"the required parameter '{param.name}' is not given")
            if param.name not in bound:
                continue  # left to its default
        if isinstance(param, AttributeParameter):
            checks.append(_check_attribute(param, value))
        elif value is None and param.name in optional:
            checks.append(ParameterCheck(param.name, False, True, "None", "None (optional)"))
        else:
            checks.append(_check_input(param, value))
    return SignatureMatch(checks=tuple(checks))


def schema_defaults(
    target: Any, signature: OpSignature | None, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """Defaults from the ATen schema of ``target`` for the parameters that the ONNX
    signature requires but the call leaves out (``aten::amax(x)`` means ``dim=[]``;
    torchlib's function has no default for ``dim``)."""
    schema = getattr(target, "_schema", None)
    if schema is None or signature is None:
        return {}
    aten_defaults = {
        argument.name: argument.default_value
        for argument in schema.arguments
        if argument.has_default_value() and argument.default_value is not None
    }
    filled: dict[str, Any] = {}
    for position, param in enumerate(signature.params):
        if position < len(args) or param.name in kwargs or not _is_required(param):
            continue
        if isinstance(param, Parameter) and param.variadic:
            break
        if param.name in aten_defaults:
            filled[param.name] = aten_defaults[param.name]
    return filled


def optional_parameters(function: Any) -> frozenset[str]:
    """Names of the Python function's parameters annotated ``Optional[...]``/``X | None``
    or defaulting to None: the ONNX function accepts None for them."""
    python_function = getattr(function, "function", None) or getattr(function, "func", None)
    if python_function is None:
        return frozenset()
    try:
        return _optional_parameters(python_function)
    except TypeError:  # unhashable or odd callables
        return frozenset()


@functools.lru_cache(maxsize=2048)
def _optional_parameters(python_function: Any) -> frozenset[str]:
    try:
        parameters = inspect.signature(python_function).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    return frozenset(
        p.name for p in parameters if p.default is None or _annotation_allows_none(p.annotation)
    )


def _annotation_allows_none(annotation: Any) -> bool:
    if annotation is inspect.Parameter.empty:
        return False
    if isinstance(annotation, str):  # postponed annotations
        text = annotation.replace(" ", "")
        return text.startswith("Optional[") or "|None" in text or "None|" in text
    if annotation is None or annotation is type(None):
        return True
    return any(_annotation_allows_none(arg) for arg in typing.get_args(annotation)) if typing.get_origin(
        annotation
    ) in (typing.Union, types.UnionType) else False


class _Variadic(list):
    """The arguments a variadic input took."""


def _is_required(param: Parameter | AttributeParameter) -> bool:
    return bool(param.required) and not param.has_default()


# -- inputs -------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _allowed_element_types(constraint: TypeConstraintParam) -> tuple[frozenset, frozenset, bool]:
    """(tensor element types, sequence element types, accepts None) of a constraint."""
    tensors, sequences = set(), set()
    optional = False
    for type_ in constraint.allowed_types:
        if isinstance(type_, ir.OptionalType):
            optional = True
            type_ = type_.elem_type
        if isinstance(type_, ir.TensorType):
            tensors.add(type_.dtype)
        elif isinstance(type_, ir.SequenceType) and isinstance(type_.elem_type, ir.TensorType):
            sequences.add(type_.elem_type.dtype)
    return frozenset(tensors), frozenset(sequences), optional


def _check_input(param: Parameter, value: Any) -> ParameterCheck:
    tensors, sequences, optional = _allowed_element_types(param.type_constraint)
    allowed = _format_constraint(param)

    def check(fits: bool, got: str) -> ParameterCheck:
        return ParameterCheck(param.name, False, fits, got, allowed)

    if value is None:
        return check(optional or not param.required, "None")
    if isinstance(value, _Variadic):
        types = [_value_type(v) for v in value if v is not None]
        fits = all(t is None or t[1] in tensors for t in types)
        return check(fits, "(" + ", ".join(_format_value_type(v) for v in value) + ")")

    value_type = _value_type(value)
    if value_type is not None:
        container, dtype = value_type
        pool = tensors if container == "tensor" else sequences
        return check(dtype in pool, _format_value_type(value))

    kind = _types.scalar_kind(value)
    if kind is not None:
        fits = bool(_types.element_types_for_kind(kind) & tensors)
        return check(fits, f"{kind} {value!r}")

    if isinstance(value, (list, tuple)):
        return _check_list_input(param, value, tensors, sequences, check)

    if isinstance(value, torch.fx.Node):
        # No FakeTensor metadata: the type cannot be known, so do not hold it against
        # the function.
        return check(True, f"node '{value.name}' of unknown type")
    return check(False, _describe(value))


def _check_list_input(param, value, tensors, sequences, check) -> ParameterCheck:
    items = [v for v in value if v is not None]
    if not items:
        return check(bool(tensors or sequences), "empty list")
    tensor_dtypes = []
    kind = None
    unknown = False
    for item in items:
        item_type = _value_type(item)
        if item_type is not None and item_type[0] == "tensor":
            if isinstance(item, torch.fx.Node) and _is_symbolic_scalar(item):
                # A SymInt in a size list: one element of an int64 tensor.
                kind = _types.wider_kind(kind, _kind_of_dtype(item_type[1]))
            else:
                tensor_dtypes.append(item_type[1])
        elif _types.scalar_kind(item) is not None:
            kind = _types.wider_kind(kind, _types.scalar_kind(item))
        elif isinstance(item, torch.fx.Node):
            unknown = True
        else:
            return check(False, f"list containing {_describe(item)}")
    if tensor_dtypes:
        # A list of tensors is a sequence (or, for a variadic input, several tensors).
        pool = tensors if param.variadic else sequences
        fits = all(d in pool for d in tensor_dtypes)
        got = "list of " + ", ".join(f"tensor({d.name})" for d in tensor_dtypes)
        return check(fits, got)
    if kind is None:  # only nodes of unknown type
        return check(True, "list of nodes of unknown type")
    element_types = _types.element_types_for_kind(kind)
    fits = bool(element_types & (tensors | sequences)) or unknown and bool(tensors or sequences)
    return check(fits, f"list of {kind}s {_short(value)}")


def _is_symbolic_scalar(node: torch.fx.Node) -> bool:
    return not isinstance(node.meta.get("val"), torch.Tensor)


def _kind_of_dtype(dtype: ir.DataType) -> str:
    if dtype == ir.DataType.BOOL:
        return "bool"
    if dtype in _types.INT_TYPES:
        return "int"
    return "float"


def _value_type(value: Any) -> tuple[str, ir.DataType] | None:
    """("tensor" | "sequence", element type) of a node argument, None if not a node
    or its type is unknown."""
    if not isinstance(value, torch.fx.Node):
        return None
    val = value.meta.get("val")
    if isinstance(val, torch.Tensor):
        return "tensor", _types.torch_dtype_to_onnx(val.dtype)
    scalar = _types.symbolic_scalar_type(val)
    if scalar is not None:
        return "tensor", scalar
    if isinstance(val, (list, tuple)) and val and all(isinstance(v, torch.Tensor) for v in val):
        dtypes = {_types.torch_dtype_to_onnx(v.dtype) for v in val}
        if len(dtypes) == 1:
            return "sequence", dtypes.pop()
    return None


def _format_value_type(value: Any) -> str:
    if not isinstance(value, torch.fx.Node):
        return _describe(value)
    val = value.meta.get("val")
    value_type = _value_type(value)
    if value_type is None:
        return f"node '{value.name}' of unknown type"
    container, dtype = value_type
    if container == "sequence":
        return f"sequence(tensor({dtype.name}))"
    if isinstance(val, torch.Tensor):
        return f"tensor({dtype.name})"
    return f"{type(val).__name__} (0-d tensor({dtype.name}))"


def _format_constraint(param: Parameter) -> str:
    names = sorted(str(t) for t in param.type_constraint.allowed_types)
    if len(names) > 8:
        names = names[:8] + [f"... {len(names) - 8} more"]
    return f"{param.type_constraint.name} = {{{', '.join(names)}}}"


# -- attributes -----------------------------------------------------------------------


def _check_attribute(param: AttributeParameter, value: Any) -> ParameterCheck:
    allowed = param.type.name
    fits = value is None or _attribute_value_fits(param.type, value)
    return ParameterCheck(param.name, True, fits, _describe(value), allowed)


def _is_int(value: Any) -> bool:
    return isinstance(value, (bool, int, torch.dtype))


def _is_float(value: Any) -> bool:
    return isinstance(value, (bool, int, float)) and not isinstance(value, torch.dtype)


def _attribute_value_fits(type_: ir.AttributeType, value: Any) -> bool:
    if type_ == ir.AttributeType.INT:
        return _is_int(value)
    if type_ == ir.AttributeType.FLOAT:
        return _is_float(value)
    if type_ == ir.AttributeType.STRING:
        return isinstance(value, _STRING_LIKE)
    if type_ == ir.AttributeType.TENSOR:
        return isinstance(value, torch.Tensor)
    if not isinstance(value, (list, tuple)):
        return False
    if type_ == ir.AttributeType.INTS:
        return all(_is_int(v) for v in value)
    if type_ == ir.AttributeType.FLOATS:
        return all(_is_float(v) for v in value)
    if type_ == ir.AttributeType.STRINGS:
        return all(isinstance(v, str) for v in value)
    if type_ == ir.AttributeType.TENSORS:
        return all(isinstance(v, torch.Tensor) for v in value)
    return False


# -- formatting -----------------------------------------------------------------------


def _describe(value: Any) -> str:
    if isinstance(value, torch.fx.Node):
        return f"node '{value.name}' ({_format_value_type(value)})"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} {_short(value)}"
    if isinstance(value, torch.dtype):
        return f"torch.dtype {value}"
    return f"{type(value).__name__} {value!r}"


def _short(value: Sequence[Any], limit: int = 6) -> str:
    items = [v.name if isinstance(v, torch.fx.Node) else repr(v) for v in value[:limit]]
    if len(value) > limit:
        items.append("...")
    return "[" + ", ".join(items) + "]"
