"""Running bfloat16 models on a runtime without bfloat16 kernels.

ONNX Runtime's CPU provider implements few ops in bfloat16 (no Add, no Gemm). The
exported model stays bfloat16 (it runs as it is on providers that have the kernels,
e.g. CUDA); to run it on the CPU, :func:`widen_bfloat16` makes a copy computed in
float32: every bfloat16 value, weight, constant and cast target becomes float32, and
the caller casts inputs to float32 and outputs back to bfloat16 at the boundary. The
results are then float32 computations rounded to bfloat16 at the outputs: at least as
accurate as bfloat16 arithmetic, so they can differ from PyTorch's bfloat16 results by
bfloat16 rounding.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
import onnx_ir as ir

from fx2onnx.onnx_passes.model_graphs import model_graphs

_BF16 = ir.DataType.BFLOAT16
_F32 = ir.DataType.FLOAT
# Attributes that name an element type (Cast's `to`, EyeLike's and Random*'s `dtype`).
_DTYPE_ATTRIBUTES = ("to", "dtype")


def has_bfloat16(model: onnx.ModelProto) -> bool:
    return any(
        value.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16
        for value in list(model.graph.input) + list(model.graph.output)
    ) or any(t.data_type == onnx.TensorProto.BFLOAT16 for t in model.graph.initializer)


def widen_bfloat16(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` where bfloat16 is float32 throughout (functions included)."""
    widened = ir.serde.deserialize_model(model)
    for value in widened.graph.initializers.values():
        if value.dtype == _BF16 and value.const_value is not None:
            value.const_value = _widened_tensor(value.const_value, value.name)
    for graph in model_graphs(widened):
        for value in _values(graph):
            if value.dtype == _BF16:
                value.dtype = _F32
        for node in graph:
            _widen_attributes(node)
    return ir.serde.serialize_model(widened)


def _values(graph: ir.Graph | ir.Function) -> Iterator[ir.Value]:
    yield from graph.inputs
    yield from graph.outputs
    for node in graph:
        yield from (v for v in node.inputs if v is not None)
        yield from node.outputs


def _widen_attributes(node: ir.Node) -> None:
    for name, attribute in list(node.attributes.items()):
        if name in _DTYPE_ATTRIBUTES and attribute.type == ir.AttributeType.INT and attribute.value == _BF16.value:
            node.attributes[name] = ir.AttrInt64(name, _F32.value)
        elif attribute.type == ir.AttributeType.TENSOR and attribute.value.dtype == _BF16:
            node.attributes[name] = ir.AttrTensor(name, _widened_tensor(attribute.value, attribute.value.name))


def _widened_tensor(tensor: ir.TensorProtocol, name: str | None) -> ir.Tensor:
    array = np.asarray(tensor.numpy()).astype(np.float32)
    return ir.tensor(array, dtype=_F32, name=name)
