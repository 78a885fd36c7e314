"""A linear layer's bias of zeros is left out (the product is the sum); a bias holding
any other number, a bias without data (fake mode) and a sum the graph outputs stay."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir

from fx2onnx.onnx_passes.zero_biases import drop_zero_biases

K, N = 8, 6
# bias of each layer: zeros, -0.0 everywhere, one element not zero, zeros added to an output
BIASES = {"zero": np.zeros(N), "signed": np.full(N, -0.0), "other": np.eye(N)[3] * 0.5, "output": np.zeros(N)}


def _model(rng: np.random.Generator) -> onnx.ModelProto:
    info = oh.make_tensor_value_info
    nodes, weights = [], []
    for name, bias in BIASES.items():
        nodes.append(oh.make_node("MatMul", ["x", f"w_{name}"], [f"p_{name}"]))
        nodes.append(oh.make_node("Add", [f"b_{name}", f"p_{name}"] if name == "other" else [f"p_{name}", f"b_{name}"],
                                  [name if name == "output" else f"s_{name}"]))
        if name != "output":
            nodes.append(oh.make_node("Relu", [f"s_{name}"], [name]))
        weights += [onnx.numpy_helper.from_array(rng.standard_normal((K, N)).astype(np.float32), f"w_{name}"),
                    onnx.numpy_helper.from_array(bias.astype(np.float32), f"b_{name}")]
    outputs = [info(name, onnx.TensorProto.FLOAT, ["b", "s", N]) for name in BIASES]
    graph = oh.make_graph(nodes, "g", [info("x", onnx.TensorProto.FLOAT, ["b", "s", K])], outputs, weights)
    return onnx.shape_inference.infer_shapes(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21)]))


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


def _biases_added(model: ir.Model) -> list[str]:
    return sorted(v.name for n in model.graph if n.op_type == "Add" for v in n.inputs if v is not None and v.is_initializer())


def test_a_bias_of_zeros_is_left_out_and_the_numbers_stay() -> None:
    rng = np.random.default_rng(0)
    before = _model(rng)
    model = ir.serde.deserialize_model(before)
    assert drop_zero_biases(model) == 2
    assert _biases_added(model) == ["b_other", "b_output"]
    after = ir.serde.serialize_model(model)
    onnx.checker.check_model(after, full_check=True)
    assert collections.Counter(n.op_type for n in after.graph.node)["Add"] == 2
    assert not {"b_zero", "b_signed"} & {t.name for t in after.graph.initializer}  # no longer in the file
    x = rng.standard_normal((2, 3, K)).astype(np.float32)
    for expected, actual in zip(_run(before, x), _run(after, x)):
        np.testing.assert_array_equal(actual, expected)


def test_a_bias_without_data_stays() -> None:
    model = ir.serde.deserialize_model(_model(np.random.default_rng(0)))
    model.graph.initializers["b_zero"].const_value = None  # a fake-mode weight: what it will hold is unknown
    assert drop_zero_biases(model) == 1  # the -0.0 bias only
    assert _biases_added(model) == ["b_other", "b_output", "b_zero"]
