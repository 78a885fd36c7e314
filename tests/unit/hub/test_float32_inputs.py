"""A float16 one-pass folder takes its float inputs in float32 (precision/float32_inputs.py)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from fx2onnx.hub.precision.float32_inputs import float32_inputs
from fx2onnx.hub.precision.float32_twin import widen_to_float32


def _half_model() -> ir.Model:
    """pixel_values (float16) and ids (int64) in, pixel_values' Relu and ids' Neg out."""
    pixels = ir.Value(name="pixel_values", shape=ir.Shape(["batch_size", 3]), type=ir.TensorType(ir.DataType.FLOAT16))
    ids = ir.Value(name="ids", shape=ir.Shape(["batch_size"]), type=ir.TensorType(ir.DataType.INT64))
    relu, neg = ir.Node("", "Relu", [pixels], num_outputs=1), ir.Node("", "Neg", [ids], num_outputs=1)
    for node, name, value in ((relu, "y", pixels), (neg, "z", ids)):
        node.outputs[0].name, node.outputs[0].dtype, node.outputs[0].shape = name, value.dtype, value.shape
    graph = ir.Graph([pixels, ids], [relu.outputs[0], neg.outputs[0]], nodes=[relu, neg], opset_imports={"": 20}, name="half")
    return ir.Model(graph, ir_version=10)


def test_float16_inputs_become_float32_cast_as_the_first_node():
    model = _half_model()
    assert float32_inputs(model) == ["pixel_values"]
    assert [(v.name, v.dtype) for v in model.graph.inputs] == [("pixel_values", ir.DataType.FLOAT), ("ids", ir.DataType.INT64)]
    assert list(model.graph.inputs[0].shape) == ["batch_size", 3]
    assert model.graph.node(0).op_type == "Cast" and model.graph.outputs[0].dtype == ir.DataType.FLOAT16
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto, full_check=True)
    session = ort.InferenceSession(proto.SerializeToString())
    y, z = session.run(None, {"pixel_values": np.array([[-1.0, 2.5, 3.0]], np.float32), "ids": np.array([4])})
    assert y.dtype == np.float16 and y.tolist() == [[0.0, 2.5, 3.0]] and z.tolist() == [-4]
    assert float32_inputs(model) == []  # nothing left to change


def test_the_float32_twin_of_such_a_model_casts_to_float32():
    model = _half_model()
    float32_inputs(model)
    widen_to_float32(model)
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto, full_check=True)
    y, _ = ort.InferenceSession(proto.SerializeToString()).run(None, {"pixel_values": np.array([[-1.0, 0.1, 3.0]], np.float32),
                                                                     "ids": np.array([4])})
    assert y.dtype == np.float32 and np.array_equal(y, np.array([[0.0, 0.1, 3.0]], np.float32))
