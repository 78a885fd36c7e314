"""A TorchScript-like graph under construction, on onnx_ir.

The builder owns one `ir.Graph` (the main graph, or the body of a model-local function):
its inputs, initializers, nodes and outputs, a cache of constants, and the model-local
functions that its nodes call. Node outputs get their dtype and shape from ONNX's own
per-node inference when they are created, so that torchlib functions that read
`.dtype` / `.shape` of intermediate values get answers.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from diagnostics import DiagnosticContext, Level, rules
from fx2onnx.translate.values import TracedValue

logger = logging.getLogger(__name__)

# The ONNX opset that torchlib's functions are written against: models are built at it
# and converted to the one asked for (`ExportOptions.opset`) by the ONNX passes.
BUILD_OPSET = 18

ConstantKey = tuple[Any, ir.DataType]


# Called once per op type whose per-node inference failed (op type, the error).
InferenceFailureHandler = Callable[[str, Exception], None]


def inference_note(context: DiagnosticContext) -> InferenceFailureHandler:
    """A handler that records one note per op type whose per-node inference failed (the
    FX metadata still types the FX node's outputs; intermediate values stay untyped)."""

    def note(op_type: str, error: Exception) -> None:
        context.record(
            rules.GRAPH_BUILDING,
            Level.NOTE,
            message=(
                f"ONNX type inference of {op_type} nodes failed while building the graph "
                f"({type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}); "
                "their outputs are typed from the FX metadata where the FX node ends."
            ),
        )

    return note


class GraphBuilder:
    """Builds one ONNX graph node by node."""

    def __init__(
        self,
        name: str = "main_graph",
        opset_version: int = BUILD_OPSET,
        *,
        on_inference_failure: InferenceFailureHandler | None = None,
    ) -> None:
        self.graph = ir.Graph(
            inputs=[], outputs=[], nodes=[], opset_imports={"": opset_version}, name=name
        )
        self.opset_version = opset_version
        # Functions called by nodes of this graph, keyed by (domain, name, overload).
        self.functions: dict[ir.OperatorIdentifier, ir.Function] = {}
        self._constants: dict[ConstantKey, TracedValue] = {}
        self._node_counter = itertools.count()
        self._used_names: set[str] = set()
        # The graph whose opset imports also serve this one (itself, or a subgraph's owner).
        self._root_graph = self.graph
        self.on_inference_failure = on_inference_failure
        self._inference_failures: set[str] = set()
        # Set while one FX node is translated: names and metadata of the nodes it emits.
        self.current_scope: str = ""
        self.current_metadata: dict[str, str] = {}

    def subgraph(self, name: str) -> "GraphBuilder":
        """A builder for a subgraph (an If branch, a Loop or Scan body) of this graph.

        ONNX names are unique across a graph and its subgraphs, so the subgraph draws
        names from this builder's pool; functions and opset imports it needs go to the
        same model as this graph's.
        """
        child = GraphBuilder(name, self.opset_version, on_inference_failure=self.on_inference_failure)
        child.functions = self.functions
        child._used_names = self._used_names
        child._node_counter = self._node_counter
        child._root_graph = self._root_graph
        child._inference_failures = self._inference_failures
        child.graph.opset_imports.clear()
        return child

    # -- names ---------------------------------------------------------------------------
    def unique_name(self, base: str) -> str:
        name = base
        suffix = 1
        while name in self._used_names:
            name = f"{base}_{suffix}"
            suffix += 1
        self._used_names.add(name)
        return name

    # -- graph inputs and initializers ---------------------------------------------------
    def add_input(
        self,
        name: str,
        dtype: ir.DataType | None,
        shape: ir.Shape | None,
        is_complex: bool = False,
    ) -> TracedValue:
        value = TracedValue(self.unique_name(name), shape=shape, is_complex=is_complex)
        if dtype is not None:
            value.dtype = dtype
        self.graph.inputs.append(value)
        return value

    def add_initializer(self, name: str, tensor: ir.TensorProtocol, is_complex: bool = False) -> TracedValue:
        value = TracedValue(
            self.unique_name(name),
            shape=ir.Shape(tensor.shape),
            type=ir.TensorType(tensor.dtype),
            const_value=tensor,
            is_complex=is_complex,
        )
        self.graph.register_initializer(value)
        return value

    def set_outputs(self, outputs: Sequence[ir.Value]) -> list[TracedValue]:
        """Make ``outputs`` the graph's outputs, in order, and return them.

        A graph output must be a distinct value made by a node of this graph: a value
        that is a graph input, an initializer, a value of an enclosing graph, or listed
        twice is copied by an Identity node (which keeps its type).
        """
        final: list[TracedValue] = []
        seen: set[int] = set()
        for value in outputs:
            producer = value.producer()
            if (
                id(value) in seen
                or producer is None
                or producer.graph is not self.graph
                or value.is_graph_input()
                or value.is_initializer()
            ):
                (copy,) = self.add_node("", "Identity", [value])
                copy.dtype, copy.shape = value.dtype, value.shape
                copy.is_complex = getattr(value, "is_complex", False)
                value = copy
            seen.add(id(value))
            final.append(value)  # type: ignore[arg-type]
        self.graph.outputs.extend(final)
        return final

    # -- nodes -----------------------------------------------------------------------------
    def add_node(
        self,
        domain: str,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        attributes: Sequence[ir.Attr] = (),
        num_outputs: int = 1,
        version: int | None = None,
        overload: str = "",
    ) -> list[TracedValue]:
        # Trailing missing optional inputs are dropped; inner ones stay as empty names.
        inputs = list(inputs)
        while inputs and inputs[-1] is None:
            inputs.pop()
        outputs = [TracedValue() for _ in range(num_outputs)]
        base = f"{self.current_scope}/{op_type}" if self.current_scope else op_type
        node = ir.Node(
            domain,
            op_type,
            inputs=inputs,
            attributes=attributes,
            outputs=outputs,
            version=version,
            overload=overload,
            name=f"{base}_{next(self._node_counter)}",
            metadata_props=dict(self.current_metadata) if self.current_metadata else None,
        )
        for index, output in enumerate(outputs):
            output.name = self.unique_name(f"val_{node.name.replace('/', '_')}_{index}")
        self.graph.append(node)
        if domain == "":
            error = infer_output_types(node)
            if error is not None:
                self._note_inference_failure(op_type, error)
        return outputs

    def _note_inference_failure(self, op_type: str, error: Exception) -> None:
        # Inference is an optimisation: one note per op type, never a failure.
        if op_type in self._inference_failures:
            return
        self._inference_failures.add(op_type)
        if self.on_inference_failure is not None:
            self.on_inference_failure(op_type, error)
        else:
            logger.debug("ONNX inference of %s failed: %s", op_type, error)

    def constant(self, value: Any, dtype: ir.DataType) -> TracedValue:
        """A Constant node holding a Python scalar or list, shared by all its users."""
        key_value = tuple(value) if isinstance(value, list) else value
        key = (key_value, type(key_value), dtype)
        cached = self._constants.get(key)  # type: ignore[arg-type]
        if cached is not None:
            return cached
        array = np.array(value, dtype=dtype.numpy())
        tensor = ir.tensor(array, dtype=dtype)
        (output,) = self.add_node("", "Constant", [], [ir.AttrTensor("value", tensor)])
        output.dtype = dtype
        output.shape = ir.Shape(array.shape)
        output.const_value = tensor
        self._constants[key] = output  # type: ignore[index]
        return output

    def tensor_constant(self, tensor: ir.TensorProtocol) -> TracedValue:
        (output,) = self.add_node("", "Constant", [], [ir.AttrTensor("value", tensor)])
        output.dtype = tensor.dtype
        output.shape = ir.Shape(tensor.shape)
        output.const_value = tensor
        return output

    # -- functions ---------------------------------------------------------------------
    def add_function(self, function: ir.Function, domain_version: int = 1) -> None:
        self.functions.setdefault(function.identifier(), function)
        self.import_opset(function.domain, domain_version)

    def import_opset(self, domain: str, version: int) -> None:
        self._root_graph.opset_imports.setdefault(domain, version)

    # -- result --------------------------------------------------------------------------
    def remove_unused_initializers(self) -> None:
        """Weights no node reads (e.g. BatchNorm's num_batches_tracked in eval) are dropped."""
        outputs = {id(v) for v in self.graph.outputs}
        for name, value in list(self.graph.initializers.items()):
            if not value.uses() and id(value) not in outputs:
                del self.graph.initializers[name]

    def build_model(self, producer_version: str) -> ir.Model:
        self.remove_unused_initializers()
        model = ir.Model(
            self.graph,
            ir_version=10,
            producer_name="fx2onnx",
            producer_version=producer_version,
            functions=list(self.functions.values()),
        )
        # Function bodies may use domains of their own; the model must import them all.
        for function in self.functions.values():
            for domain, version in function.opset_imports.items():
                self.graph.opset_imports.setdefault(domain, version)
        return model


@functools.cache
def op_schema(op_type: str, opset: int, domain: str = "") -> onnx.defs.OpSchema:
    """ONNX's schema of an op at an opset (onnx.defs.SchemaError when there is none),
    looked up once per process."""
    return onnx.defs.get_schema(op_type, opset, domain)


def _type_proto_of(value: ir.Value) -> onnx.TypeProto | None:
    if value.dtype is None:
        return None
    shape = None
    if value.shape is not None:
        shape = [d if isinstance(d, int) else (d.value or None) for d in value.shape]
    return onnx.helper.make_tensor_type_proto(value.dtype.value, shape)


# ONNX inference of one node depends only on its op, attributes and input types (and
# the values of small constant inputs); models repeat the same nodes layer after layer,
# so results are kept by that key. Bounded: a key of an unusual graph is not kept forever.
_Inferred = tuple[list[tuple["ir.DataType | None", "tuple | None"]], "Exception | None"]
_INFERRED: dict[Any, _Inferred] = {}
_MAX_INFERRED = 50_000


class _Uncacheable(Exception):
    """A node whose inference result is not kept (large tensor or unusual attribute)."""


def _attribute_key(attr: ir.Attr) -> Any:
    value = attr.value
    if attr.type == ir.AttributeType.TENSOR:
        if value.size > 64:
            raise _Uncacheable
        return (attr.name, "tensor", value.dtype, tuple(value.shape), value.tobytes())
    if isinstance(value, (list, tuple)):
        value = tuple(value)
    if not isinstance(value, (int, float, str, bytes, tuple)):
        raise _Uncacheable
    return (attr.name, attr.type, value)


def _inference_key(node: ir.Node) -> Any:
    inputs = []
    for value in node.inputs:
        if value is None:
            inputs.append(None)
            continue
        shape = None if value.shape is None else tuple(d if isinstance(d, int) else str(d) for d in value.shape)
        const = value.const_value
        data = None
        if const is not None and const.size <= 64:
            try:
                data = const.tobytes()
            except Exception:  # noqa: BLE001 - e.g. a fake-mode weight: no data, no key; inference reports it
                return None
        inputs.append((value.dtype, shape, data))
    try:
        attributes = tuple(sorted(_attribute_key(a) for a in node.attributes.values()))
    except _Uncacheable:
        return None
    return (node.domain, node.op_type, node.version, attributes, tuple(inputs), len(node.outputs))


def infer_output_types(node: ir.Node) -> Exception | None:
    """Fill dtype and shape of a standard-domain node's outputs with ONNX's inference
    (remembered per op, attributes and input types).

    Best effort: when an input's type is unknown or the op cannot be inferred, the
    outputs stay untyped, and the FX metadata fills the final outputs of the FX node.
    Returns the inference error, if any.
    """
    if any(attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for attr in node.attributes.values()):
        return None  # control flow: its builder types the outputs
    key = _inference_key(node)
    inferred = _INFERRED.get(key) if key is not None else None
    if inferred is None:
        inferred = _run_inference(node)
        if key is not None and len(_INFERRED) < _MAX_INFERRED:
            _INFERRED[key] = inferred
    types, error = inferred
    for output, (dtype, dims) in zip(node.outputs, types):
        if dtype is not None:
            output.dtype = dtype
        if dims is not None:
            output.shape = ir.Shape(dims)
    return error


def _run_inference(node: ir.Node) -> _Inferred:
    """ONNX's inference of a node's output types: (dtype, dims) per output, None where
    unknown, and the inference error if any."""
    unknown: list[tuple[ir.DataType | None, tuple | None]] = [(None, None)] * len(node.outputs)
    input_types = {}
    for value in node.inputs:
        if value is None:
            continue
        type_proto = _type_proto_of(value)
        if type_proto is None:
            return unknown, None
        input_types[value.name] = type_proto
    try:
        schema = op_schema(node.op_type, node.version or BUILD_OPSET, node.domain)
        node_proto = ir.serde.serialize_node(node)
        input_data = {
            value.name: ir.serde.serialize_tensor(value.const_value)
            for value in node.inputs
            if value is not None and value.const_value is not None and value.const_value.size <= 64
        }
        inferred = onnx.shape_inference.infer_node_outputs(
            schema, node_proto, input_types, input_data=input_data
        )
    except Exception as error:  # noqa: BLE001 - inference is an optimization, never a failure
        return unknown, error
    result = []
    for output in node.outputs:
        type_proto = inferred.get(output.name)
        if type_proto is None or not type_proto.HasField("tensor_type"):
            result.append((None, None))
            continue
        tensor_type = type_proto.tensor_type
        dtype = ir.DataType(tensor_type.elem_type) if tensor_type.elem_type else None
        dims: tuple | None = None
        if tensor_type.HasField("shape"):
            dims = tuple(
                dim.dim_value if dim.HasField("dim_value") else (dim.dim_param if dim.HasField("dim_param") else None)
                for dim in tensor_type.shape.dim
            )
        result.append((dtype, dims))
    return result, None
