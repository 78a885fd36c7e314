"""Linear layers of an ONNX graph or function body, as the weight quantization passes find them.

A linear layer is a MatMul whose second input is a 2-D float initializer (in a function
body, a parameter every call gives one: the caller's predicate `stored`), read as it is
(stored in MatMul's layout, see `weight_layout`) or through ``Transpose(perm=[1, 0])``
(a weight shared with an embedding, which keeps PyTorch's layout), or a Gemm of such a
weight (GPT-2's Conv1D); a ``[N]`` bias added to its product (the Add after a MatMul,
Gemm's C) belongs to the layer. `replace_linear` puts a quantized form in its place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx_ir as ir

from fx2onnx.onnx_passes.function_calls import FunctionCalls

# float types of the weights the passes quantize (onnxruntime's CPU kernels' activation types)
FLOAT_WEIGHT_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16)


@dataclass(frozen=True)
class LinearLayer:
    node: ir.Node  # the MatMul or Gemm
    weight: ir.Value  # the initializer
    stored_nk: bool  # the initializer is [N, K] (read through a transpose), not MatMul's [K, N]
    bias: ir.Value | None = None  # [N], added to the product
    bias_add: ir.Node | None = None  # the Add of the bias after a MatMul, absorbed too


Stored = Callable[[ir.Value], bool]


def _is_initializer(value: ir.Value) -> bool:
    return value.is_initializer()


def _is_float_initializer(value: ir.Value | None, stored: Stored = _is_initializer) -> bool:
    return (
        value is not None and stored(value) and value.dtype in FLOAT_WEIGHT_TYPES
        and value.shape is not None and len(value.shape) == 2 and all(isinstance(d, int) for d in value.shape)
    )


def _is_standard(node: ir.Node, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in ("", "ai.onnx")


def _int_attribute(node: ir.Node, name: str, default: int) -> int:
    attribute = node.attributes.get(name)
    return default if attribute is None else attribute.as_int()


def _float_attribute(node: ir.Node, name: str) -> float:
    attribute = node.attributes.get(name)
    return 1.0 if attribute is None else attribute.as_float()


def _weight(b: ir.Value | None, transposed: bool, stored: Stored) -> tuple[ir.Value, bool] | None:
    """The initializer behind a MatMul's second input and whether it is stored [N, K]."""
    if _is_float_initializer(b, stored):
        return b, transposed  # type: ignore[return-value]
    producer = b.producer() if b is not None else None
    if producer is not None and _is_standard(producer, "Transpose") and _is_float_initializer(producer.inputs[0], stored):
        perm = producer.attributes.get("perm")
        if perm is None or list(perm.as_ints()) == [1, 0]:
            return producer.inputs[0], not transposed  # type: ignore[return-value]
    return None


def _is_bias(value: ir.Value | None, n: int, dtype: ir.DataType | None) -> bool:
    return value is not None and value.dtype == dtype and value.shape is not None and list(value.shape) == [n]


def _bias_add(node: ir.Node, n: int, dtype: ir.DataType | None, stored: Stored) -> tuple[ir.Value, ir.Node] | None:
    """The Add of a [N] bias that is the only use of a MatMul's product (nn.Linear's bias)."""
    uses = list(node.outputs[0].uses())
    if len(uses) != 1 or not _is_standard(uses[0][0], "Add") or node.outputs[0] in (node.graph.outputs if node.graph else []):
        return None
    add = uses[0][0]
    other = add.inputs[1 - uses[0][1]]
    return (other, add) if _is_bias(other, n, dtype) and stored(other) else None  # type: ignore[return-value]


def _n(weight: ir.Value, stored_nk: bool) -> int:
    assert weight.shape is not None
    return int(weight.shape[0 if stored_nk else 1])


def linear_layer(node: ir.Node, stored: Stored = _is_initializer) -> LinearLayer | None:
    if _is_standard(node, "MatMul") and len(node.inputs) == 2:
        found = _weight(node.inputs[1], False, stored)
        if found is None:
            return None
        weight, stored_nk = found
        bias = _bias_add(node, _n(weight, stored_nk), weight.dtype, stored)
        return LinearLayer(node, weight, stored_nk, *(bias or (None, None)))
    if not _is_standard(node, "Gemm") or _int_attribute(node, "transA", 0) or _float_attribute(node, "alpha") != 1.0:
        return None
    found = _weight(node.inputs[1], bool(_int_attribute(node, "transB", 0)), stored)
    if found is None:
        return None
    weight, stored_nk = found
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if bias is not None and (_float_attribute(node, "beta") != 1.0 or not _is_bias(bias, _n(weight, stored_nk), weight.dtype)):
        return None
    return LinearLayer(node, weight, stored_nk, bias)


def lm_head(graph: ir.Graph, output_name: str, calls: FunctionCalls | None = None) -> ir.Node | None:
    """The MatMul or Gemm computing the output ``output_name`` (through ops that only
    reshape, slice or cast it, and into the module functions that return it)."""
    value = next((v for v in graph.outputs if v.name == output_name), None)
    while value is not None:
        node = value.producer()
        if node is None:
            return None
        if node.op_type in ("MatMul", "Gemm"):
            return node
        called = calls.called(node) if calls is not None else None
        if called is not None:
            value = called.outputs[list(node.outputs).index(value)]
            continue
        if node.op_type not in ("Reshape", "Slice", "Cast", "Squeeze", "Unsqueeze", "Identity", "Gather"):
            return None
        value = node.inputs[0]
    return None


def linear_layers(graph: ir.Graph | ir.Function, stored: Stored = _is_initializer) -> list[LinearLayer]:
    """The linear layers of ``graph``, in graph order (``stored``: which values are weights)."""
    return [found for node in list(graph) if (found := linear_layer(node, stored)) is not None]


def take_place(old: ir.Value, new: ir.Value) -> None:
    """``new`` replaces ``old`` everywhere, with its shape, type and name (a graph output
    keeps its name: `logits`)."""
    new.shape, new.type = old.shape, old.type
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    name, old.name = old.name, None
    new.name = name


def replace_linear(graph: ir.Graph | ir.Function, linear: LinearLayer, output: ir.Value) -> None:
    """Make ``output`` (of nodes already in ``graph`` before the layer's last node) what
    the layer computed, with its name, and remove the layer's nodes, and its weight and
    bias when nothing else reads them."""
    take_place(linear.bias_add.outputs[0] if linear.bias_add else linear.node.outputs[0], output)
    b = linear.node.inputs[1]
    for replaced in (linear.bias_add, linear.node):
        if replaced is not None:
            graph.remove(replaced, safe=True)
    producer = b.producer() if b is not None else None
    if producer is not None and not b.uses():  # the Transpose of a shared weight
        graph.remove(producer, safe=True)
    for value in (linear.weight, linear.bias):
        if value is not None and value.is_initializer() and not value.uses():
            assert value.name is not None
            graph.initializers.pop(value.name)
