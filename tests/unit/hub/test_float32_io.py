"""A float16 one-pass folder takes and gives its float values in float32 (precision/float32_io.py)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from fx2onnx.hub.precision.float32_io import float32_io, in_declared_floats
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


def test_float16_inputs_and_outputs_become_float32_cast_by_the_first_and_last_nodes():
    model = _half_model()
    assert float32_io(model) == ["pixel_values", "y"]
    assert [(v.name, v.dtype) for v in model.graph.inputs] == [("pixel_values", ir.DataType.FLOAT), ("ids", ir.DataType.INT64)]
    assert [(v.name, v.dtype) for v in model.graph.outputs] == [("y", ir.DataType.FLOAT), ("z", ir.DataType.INT64)]
    assert list(model.graph.inputs[0].shape) == ["batch_size", 3] and list(model.graph.outputs[0].shape) == ["batch_size", 3]
    assert [node.op_type for node in model.graph] == ["Cast", "Relu", "Neg", "Cast"]
    assert model.graph.node(1).outputs[0].dtype == ir.DataType.FLOAT16  # computed in float16
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto, full_check=True)
    session = ort.InferenceSession(proto.SerializeToString())
    y, z = session.run(None, {"pixel_values": np.array([[-1.0, 2.5, 3.0]], np.float32), "ids": np.array([4])})
    assert y.dtype == np.float32 and y.tolist() == [[0.0, 2.5, 3.0]] and z.tolist() == [-4]
    assert float32_io(model) == []  # nothing left to change


def test_the_float32_twin_of_such_a_model_casts_to_float32():
    model = _half_model()
    float32_io(model)
    widen_to_float32(model)
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto, full_check=True)
    y, _ = ort.InferenceSession(proto.SerializeToString()).run(None, {"pixel_values": np.array([[-1.0, 0.1, 3.0]], np.float32),
                                                                     "ids": np.array([4])})
    assert y.dtype == np.float32 and np.array_equal(y, np.array([[0.0, 0.1, 3.0]], np.float32))  # 0.1 not rounded to float16
    assert not [node for node in model.graph if node.op_type == "Cast" and node.attributes["to"].value == ir.DataType.FLOAT16]


def test_a_feed_in_the_float_types_the_session_declares():
    session = ort.InferenceSession(ir.serde.serialize_model(_half_model()).SerializeToString())  # float16 pixel_values
    feed = in_declared_floats(session, {"pixel_values": np.ones((1, 3), np.float32), "ids": np.array([4]), "other": np.ones(2)})
    assert feed["pixel_values"].dtype == np.float16 and feed["ids"].dtype == np.int64 and feed["other"].dtype == np.float64
