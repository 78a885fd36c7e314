"""An onnxscript evaluator that records ops into a `GraphBuilder` instead of running them.

While a torchlib function runs under `onnxscript.evaluator.default_as(evaluator)`:
- an `Op` call (`op.Add(x, y)`) becomes one node; Python scalars and lists given to
  tensor inputs become constants of the type the op signature binds them to;
- a `TracedOnnxFunction` runs its Python body, so it is traced into primitive ops;
- an `OnnxFunction` (a compiled ONNX Script function) becomes a call of a model-local
  function in its own domain. This is the one place that choice is made: the function
  definition is added to the model once and every call site refers to it.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
import onnxscript
from onnxscript import values as osv

from fx2onnx.translate.graph_builder import GraphBuilder
from fx2onnx.translate.values import TracedValue


class GraphConstructionError(RuntimeError):
    """A torchlib function could not be traced into the graph."""


def _python_dtype(value: Any) -> ir.DataType:
    if isinstance(value, (ir.Tensor, ir.Value)) and value.dtype is not None:
        return value.dtype
    if isinstance(value, np.ndarray):
        return ir.DataType.from_numpy(value.dtype)
    if isinstance(value, bool):
        return ir.DataType.BOOL
    if isinstance(value, int):
        return ir.DataType.INT64
    if isinstance(value, float):
        return ir.DataType.FLOAT
    if isinstance(value, str):
        return ir.DataType.STRING
    if isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, ir.Value) and item.dtype is not None:
                return item.dtype
        if any(isinstance(item, float) for item in value):
            return ir.DataType.FLOAT
        if value and all(isinstance(item, bool) for item in value):
            return ir.DataType.BOOL
        return ir.DataType.INT64
    raise TypeError(f"Cannot make an ONNX constant of {type(value).__name__} {value!r}")


def _is_untyped_param(param: ir.schemas.Parameter) -> bool:
    """A parameter the Python function left unannotated: it allows tensors, sequences and
    optionals alike, and its body expects the Python value itself (a str mode, a number)."""
    allowed = param.type_constraint.allowed_types
    return any(isinstance(t, ir.SequenceType) for t in allowed) and any(
        isinstance(t, ir.TensorType) for t in allowed
    )


def _is_sequence_param(param: ir.schemas.Parameter) -> bool:
    allowed = param.type_constraint.allowed_types
    return bool(allowed) and all(isinstance(t, ir.SequenceType) for t in allowed)


class _Binding:
    """Arguments of one call split by the signature into named inputs and attributes."""

    def __init__(
        self,
        signature: ir.schemas.OpSignature,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
    ) -> None:
        self.signature = signature
        self.inputs: dict[str, Any] = {}
        self.attributes: dict[str, Any] = {}
        params = list(signature.params)
        position = 0
        for param in params:
            if position >= len(args):
                break
            if isinstance(param, ir.schemas.Parameter) and param.variadic:
                self.inputs[param.name] = list(args[position:])
                position = len(args)
                break
            self._assign(param, args[position])
            position += 1
        if position < len(args):
            raise TypeError(
                f"{signature.domain}::{signature.name} takes {len(params)} arguments, "
                f"got {len(args)} positional ones"
            )
        for name, value in kwargs.items():
            param = signature.params_map.get(name)
            if param is None:
                # torchlib functions accept only their own parameters; extra torch kwargs
                # (device, layout, ...) have no ONNX meaning.
                continue
            self._assign(param, value)
        # Attributes with defaults in the signature are filled by the function itself.
        for param in params:
            if isinstance(param, ir.schemas.AttributeParameter) and param.name not in self.attributes:
                if param.has_default() and param.default is not None:
                    default = param.default
                    self.attributes[param.name] = default.value if isinstance(default, ir.Attr) else default

    def _assign(self, param: ir.schemas.Parameter | ir.schemas.AttributeParameter, value: Any) -> None:
        if isinstance(param, ir.schemas.AttributeParameter):
            if value is None:
                return
            if isinstance(value, ir.Attr):
                value = value.value
            if param.type == ir.AttributeType.FLOAT and isinstance(value, int):
                value = float(value)
            elif param.type == ir.AttributeType.FLOATS and isinstance(value, (list, tuple)):
                value = [float(v) for v in value]
            self.attributes[param.name] = value
        else:
            self.inputs[param.name] = value

    def type_binding(self) -> dict[str, ir.DataType]:
        """Which dtype each type constraint takes, from the inputs that are graph values.

        A constraint that only Python numbers of different kinds meet (`where(c, 0, -inf)`)
        takes their common kind, as Python promotes them (bool < int < float), so that
        one node never receives an int64 and a float constant for the same type.
        """
        binding: dict[str, ir.DataType] = {}
        numbers: dict[str, list[bool | int | float]] = {}
        allowed: dict[str, Any] = {}
        for name, value in self.inputs.items():
            param = self.signature.params_map[name]
            constraint = param.type_constraint.name
            if isinstance(value, ir.Value) and value.dtype is not None:
                binding.setdefault(constraint, value.dtype)
            elif isinstance(value, (list, tuple)):
                for item in value:
                    if isinstance(item, ir.Value) and item.dtype is not None:
                        binding.setdefault(constraint, item.dtype)
                        break
            elif isinstance(value, (bool, int, float)):
                numbers.setdefault(constraint, []).append(value)
                allowed[constraint] = param.type_constraint.allowed_types
        for constraint, values in numbers.items():
            if constraint in binding or len({_number_rank(v) for v in values}) < 2:
                continue
            common = _python_dtype(max(values, key=_number_rank))
            if ir.TensorType(common) in allowed[constraint]:
                binding[constraint] = common
        return binding


class TracingEvaluator:
    """Implements onnxscript's evaluator protocol (`eval_op`, `eval_function`)."""

    def __init__(self, builder: GraphBuilder) -> None:
        self.builder = builder

    # -- constants -----------------------------------------------------------------------
    def _dtype_for(self, param: ir.schemas.Parameter, value: Any, binding: Mapping[str, ir.DataType]) -> ir.DataType:
        if isinstance(value, (ir.Tensor, np.ndarray)):
            return _python_dtype(value)
        bound = binding.get(param.type_constraint.name)
        if bound is not None:
            return bound
        allowed = [t for t in param.type_constraint.allowed_types if isinstance(t, ir.TensorType)]
        if len(allowed) == 1:
            return allowed[0].dtype
        dtype = _python_dtype(value)
        if allowed and all(t.dtype != dtype for t in allowed):
            # e.g. a Python int given where only floats are allowed
            return sorted(allowed, key=lambda t: t.dtype.value)[0].dtype
        return dtype

    def _as_value(self, value: Any, dtype: ir.DataType) -> ir.Value | None:
        if value is None or isinstance(value, ir.Value):
            return value
        if isinstance(value, ir.Tensor):
            return self.builder.tensor_constant(value)
        if isinstance(value, np.ndarray):
            return self.builder.tensor_constant(ir.tensor(value))
        if isinstance(value, complex):
            return self.builder.constant([value.real, value.imag], dtype)
        if isinstance(value, (list, tuple)) and any(isinstance(v, ir.Value) for v in value):
            # [value, 3] -> Concat(Reshape(value, [-1]), [3]): a 1-D tensor
            pieces = []
            for item in value:
                if isinstance(item, ir.Value):
                    pieces.append(self._reshape_1d(item))
                else:
                    pieces.append(self.builder.constant([item], dtype))
            (output,) = self.builder.add_node("", "Concat", pieces, [ir.AttrInt64("axis", 0)])
            return output
        return self.builder.constant(list(value) if isinstance(value, tuple) else value, dtype)

    def _reshape_1d(self, value: ir.Value) -> ir.Value:
        if value.shape is not None and len(value.shape) == 1:
            return value
        (output,) = self.builder.add_node(
            "", "Reshape", [value, self.builder.constant([-1], ir.DataType.INT64)]
        )
        return output

    def _convert_inputs(self, binding: _Binding, keep_lists: bool) -> dict[str, Any]:
        types = binding.type_binding()
        converted: dict[str, Any] = {}
        for name, value in binding.inputs.items():
            param = binding.signature.params_map[name]
            if isinstance(value, ir.Value) or value is None:
                converted[name] = value
            elif keep_lists and (isinstance(value, str) or _is_untyped_param(param)):
                # A traced body reads Python values of untyped parameters itself.
                converted[name] = value
            elif isinstance(value, (list, tuple)) and (keep_lists or param.variadic):
                if param.variadic and not keep_lists:
                    dtype = self._dtype_for(param, value, types)
                    converted[name] = [self._as_value(item, dtype) for item in value]
                else:
                    converted[name] = list(value)
            elif isinstance(value, (list, tuple)) and _is_sequence_param(param):
                (sequence,) = self.builder.add_node("", "SequenceConstruct", list(value))
                converted[name] = sequence
            else:
                converted[name] = self._as_value(value, self._dtype_for(param, value, types))
        return converted

    # -- the evaluator protocol ---------------------------------------------------------------
    def eval_op(self, op: osv.Op, args: Sequence[Any], kwargs: Mapping[str, Any]):
        signature = _op_signature(op)
        if signature is None:
            return self._eval_op_without_schema(op, args, kwargs)
        try:
            binding = _Binding(signature, args, kwargs)
            inputs = self._convert_inputs(binding, keep_lists=False)
        except Exception as error:
            raise GraphConstructionError(
                f"Cannot build ONNX node {op.domain or 'ai.onnx'}::{op.name} from "
                f"args={args!r} kwargs={kwargs!r}: {error}"
            ) from error
        flat_inputs = _inputs_in_signature_order(signature, inputs)
        attributes = _node_attributes(binding)
        num_outputs = _number_of_outputs(signature, binding.attributes)
        outputs = self.builder.add_node(
            op.domain, op.name, flat_inputs, attributes, num_outputs, version=_op_version(op)
        )
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _eval_op_without_schema(self, op: osv.Op, args: Sequence[Any], kwargs: Mapping[str, Any]):
        """Ops of custom domains: every positional arg is an input (None an optional one left
        out), every kwarg an attribute."""
        inputs = [a if a is None or isinstance(a, ir.Value) else self._as_value(a, _python_dtype(a)) for a in args]
        num_outputs = int(kwargs.pop("_num_outputs", 1)) if isinstance(kwargs, dict) else 1
        attributes = list(ir.convenience.convert_attributes({k: v for k, v in kwargs.items() if v is not None}))
        self.builder.import_opset(op.domain, op.opset.version or 1)
        outputs = self.builder.add_node(op.domain, op.name, inputs, attributes, num_outputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def eval_function(self, function: osv.OnnxFunction | osv.TracedOnnxFunction, args: Sequence[Any], kwargs: Mapping[str, Any]):
        signature = function.op_signature
        binding = _Binding(signature, args, kwargs)
        if isinstance(function, osv.TracedOnnxFunction) or getattr(function, "traceable", False):
            inputs = self._convert_inputs(binding, keep_lists=True)
            body = function.func if isinstance(function, osv.TracedOnnxFunction) else function.function
            # A Python number stays a Python number where the function's Python signature
            # asks for one (`dim: Optional[int]`): its body uses it as an attribute or in `if`.
            for name in _python_scalar_parameters(body) & binding.inputs.keys():
                if isinstance(binding.inputs[name], (bool, int, float)):
                    inputs[name] = binding.inputs[name]
            return body(**inputs, **binding.attributes)
        return self._call_local_function(function, binding)

    def _call_local_function(self, function: osv.OnnxFunction, binding: _Binding):
        inputs = self._convert_inputs(binding, keep_lists=False)
        flat_inputs = _inputs_in_signature_order(binding.signature, inputs)
        for callee in [function, *function.function_ir.get_called_functions().values()]:
            proto = callee.to_function_proto()
            proto.domain = _function_domain(callee)
            identifier = (proto.domain, proto.name, "")
            if identifier not in self.builder.functions:
                self.builder.add_function(ir.serde.deserialize_function(proto))
        attributes = _node_attributes(binding)
        outputs = self.builder.add_node(
            _function_domain(function),
            function.name,
            flat_inputs,
            attributes,
            num_outputs=len(binding.signature.outputs),
        )
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def _number_rank(value: bool | int | float) -> int:
    """Python's promotion order of numbers: bool < int < float."""
    return 0 if isinstance(value, bool) else 1 if isinstance(value, int) else 2


def _inputs_in_signature_order(signature: ir.schemas.OpSignature, inputs: Mapping[str, Any]) -> list[ir.Value | None]:
    """The node's inputs in parameter order; a variadic parameter contributes all its values."""
    flat: list[ir.Value | None] = []
    for param in signature.params:
        if isinstance(param, ir.schemas.Parameter):
            value = inputs.get(param.name)
            if param.variadic:
                flat.extend(value or [])
            else:
                flat.append(value)
    return flat


def _node_attributes(binding: _Binding) -> list[ir.Attr]:
    """Attributes of a node; those given as None are left out (the op's default holds).
    An empty list takes the type the signature declares: there is no item to tell it."""
    attributes = []
    for name, value in binding.attributes.items():
        if value is None:
            continue
        kind = _plain_attribute_type(value)
        if kind is None and isinstance(value, (list, tuple)) and not value:
            kind = getattr(binding.signature.params_map.get(name), "type", None)
        attributes.append(ir.convenience.convert_attribute(name, value, attr_type=kind))
    return attributes


_SCALAR_ATTRIBUTES = {int: ir.AttributeType.INT, bool: ir.AttributeType.INT, float: ir.AttributeType.FLOAT, str: ir.AttributeType.STRING}


def _plain_attribute_type(value: Any) -> ir.AttributeType | None:
    """The attribute type of numbers, strings and their lists, found without onnx_ir's
    general inference (its protocol checks dominate the time of small nodes); None for
    anything else, which onnx_ir infers."""
    kind = _SCALAR_ATTRIBUTES.get(type(value))
    if kind is not None or type(value) not in (list, tuple) or not value:
        return kind
    item_types = {type(item) for item in value}
    if item_types <= {int, bool}:
        return ir.AttributeType.INTS
    if item_types == {float}:
        return ir.AttributeType.FLOATS
    if item_types == {str}:
        return ir.AttributeType.STRINGS
    return None


# ONNX Script functions written without a domain would land in the standard domain "",
# where ONNX looks for built-in operators only; they are called in this domain instead.
USER_FUNCTION_DOMAIN = "pkg.fx2onnx.user"


def _function_domain(function: osv.OnnxFunction) -> str:
    return function.function_ir.domain or USER_FUNCTION_DOMAIN


_PYTHON_SCALARS = (bool, int, float)


@functools.cache
def _python_scalar_parameters(body: Any) -> frozenset[str]:
    """Parameters of a traced function annotated with a Python scalar type
    (`int`, `float`, `bool`, or `Optional` of one) rather than a tensor type."""
    try:
        annotations = inspect.get_annotations(body, eval_str=True)
    except Exception:  # noqa: BLE001 - unresolvable annotations: treat every input as a tensor
        return frozenset()
    names = set()
    for name, annotation in annotations.items():
        if annotation in _PYTHON_SCALARS:
            names.add(name)
        elif typing.get_origin(annotation) in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if members and all(a in _PYTHON_SCALARS for a in members):
                names.add(name)
    return frozenset(names)


# Opsets create a new `Op` at every call (`op.Add(...)`), whose signature would be built
# again from the ONNX schema each time: it is kept per schema, which never changes.
_SIGNATURES: dict[tuple[str, str, int], ir.schemas.OpSignature] = {}


def _op_signature(op: osv.Op) -> ir.schemas.OpSignature | None:
    schema = op.op_schema
    if schema is None or type(op) is not osv.Op:
        return op.op_signature
    key = (schema.domain, schema.name, schema.since_version)
    signature = _SIGNATURES.get(key)
    if signature is None:
        signature = _SIGNATURES[key] = op.op_signature
    return signature


def _op_version(op: osv.Op) -> int | None:
    # Standard-domain ops take the model's opset; versions are only kept for other domains.
    return None if op.domain == "" else op.opset.version


def _number_of_outputs(signature: ir.schemas.OpSignature, attributes: Mapping[str, Any]) -> int:
    if signature.domain == "":
        if signature.name == "Split" and isinstance(attributes.get("num_outputs"), int):
            return attributes["num_outputs"]
        if signature.name == "BatchNormalization" and not attributes.get("training_mode", 0):
            return 1
    return len(signature.outputs)


def install_value_arithmetic() -> None:
    """Let `value + other` inside torchlib bodies record ONNX ops through the evaluator."""
    TracedValue._magic_handler = onnxscript.opset18  # type: ignore[assignment]
