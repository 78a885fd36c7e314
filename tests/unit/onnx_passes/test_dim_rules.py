"""Dims read from a shape used as read (`fx2onnx.onnx_passes.dim_rules`, in the optimizer):
the graph loses the Squeeze-then-Reshape of each dim, keeps the scalar where it has other
uses, unsqueezes any other scalar made a one-element tensor, and computes the same."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper

from fx2onnx.onnx_passes.optimization import optimize_keeping_functions


def _model() -> onnx.ModelProto:
    """y = x[: n, : n - 1] for x [n, m] (dims of x: the first read twice, the second once)."""
    const = lambda name, values, dims: helper.make_node(  # noqa: E731
        "Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, dims, values))
    nodes = [
        helper.make_node("Shape", ["x"], ["n1"], start=0, end=1),
        helper.make_node("Squeeze", ["n1"], ["n"]),
        const("one_shape", [1], [1]), const("zero", [0], [1]), const("axes", [0, 1], [2]), const("minus", [1], []),
        helper.make_node("Reshape", ["n", "one_shape"], ["end0"]),  # the dim back as read
        helper.make_node("Sub", ["n", "minus"], ["n_less"]),  # the scalar has another use
        helper.make_node("Reshape", ["n_less", "one_shape"], ["end1"]),  # a scalar made one element
        helper.make_node("Concat", ["zero", "zero"], ["starts"], axis=0),
        helper.make_node("Concat", ["end0", "end1"], ["ends"], axis=0),
        helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "dims", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "m"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def test_dims_are_used_as_read_and_scalars_unsqueezed() -> None:
    original = _model()
    model = ir.from_proto(original)
    optimize_keeping_functions(model)
    optimized = ir.to_proto(model)
    onnx.checker.check_model(optimized, full_check=True)
    kinds = collections.Counter(node.op_type for node in optimized.graph.node)
    assert kinds["Reshape"] == 0 and kinds["Unsqueeze"] == 1 and kinds["Squeeze"] == 1  # the Sub still reads the scalar
    x = np.random.rand(5, 7).astype(np.float32)
    for proto in (original, optimized):
        (y,) = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})
        np.testing.assert_array_equal(y, x[:5, :4])
