"""MatMulNBits layers reading the same input packed into one: the outputs are the
unpacked layers' (onnxruntime, both forms), the packed codes are the layers' own
initializers concatenated (folded by onnxruntime at load), and layers that differ in
their optional inputs stay apart."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir

from fx2onnx.onnx_passes.packed_projections import pack_projections
from fx2onnx.onnx_passes.weight_quantization import WeightQuantization, quantize_linear_weights

K = 64
SIZES = {"q": 64, "k": 32, "v": 32, "other": 16}


def _model(rng: np.random.Generator) -> onnx.ModelProto:
    info = oh.make_tensor_value_info
    nodes = [oh.make_node("MatMul", ["x", f"w_{name}"], [name]) for name in ("q", "k", "v")]
    # a layer on the same input with a bias: not packed with the others
    nodes += [oh.make_node("MatMul", ["x", "w_other"], ["p"]), oh.make_node("Add", ["p", "bias"], ["other"])]
    weights = [onnx.numpy_helper.from_array(rng.standard_normal((K, n)).astype(np.float32), f"w_{name}") for name, n in SIZES.items()]
    weights.append(onnx.numpy_helper.from_array(rng.standard_normal(SIZES["other"]).astype(np.float32), "bias"))
    graph = oh.make_graph(
        nodes, "g", [info("x", onnx.TensorProto.FLOAT, ["b", "s", K])],
        [info(name, onnx.TensorProto.FLOAT, ["b", "s", n]) for name, n in SIZES.items()], weights,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(list(SIZES), {"x": x})


def test_layers_on_one_input_packed_into_one() -> None:
    rng = np.random.default_rng(0)
    model = ir.serde.deserialize_model(_model(rng))
    quantize_linear_weights(model, WeightQuantization(accuracy_level=0))
    unpacked = ir.serde.serialize_model(model)
    assert pack_projections(model) == 1
    packed = ir.serde.serialize_model(model)
    onnx.checker.check_model(packed, full_check=True)
    kinds = collections.Counter(node.op_type for node in packed.graph.node)
    assert (kinds["MatMulNBits"], kinds["Split"], kinds["Concat"]) == (2, 1, 2)
    node = next(n for n in packed.graph.node if n.op_type == "MatMulNBits" and len(n.input) == 3)
    assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}["N"] == 128
    # the file keeps one tensor per weight: the codes of each layer, as before packing
    assert {t.name for t in packed.graph.initializer} >= {"w_q_Q4", "w_k_Q4", "w_v_Q4", "w_q_scales"}
    x = rng.standard_normal((2, 3, K)).astype(np.float32)
    for expected, actual in zip(_run(unpacked, x), _run(packed, x)):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_only_the_query_key_and_value_an_attention_reads_by_default() -> None:
    """``attention_only``: the layers a `GroupQueryAttention` reads as its query, key and
    value are packed in that order (whatever the graph's order); other layers on the same
    input (a parallel block's MLP) stay apart."""
    rng = np.random.default_rng(0)
    info = oh.make_tensor_value_info
    nodes = [oh.make_node("MatMul", ["x", f"w_{name}"], [name]) for name in ("v", "k", "q", "gate", "up")]  # V first
    nodes.append(oh.make_node("GroupQueryAttention", ["q", "k", "v"], ["attended"], domain="com.microsoft",
                              num_heads=2, kv_num_heads=1))
    sizes = {"q": 64, "k": 32, "v": 32, "gate": 16, "up": 16}
    weights = [onnx.numpy_helper.from_array(rng.standard_normal((K, n)).astype(np.float32), f"w_{name}") for name, n in sizes.items()]
    graph = oh.make_graph(nodes, "g", [info("x", onnx.TensorProto.FLOAT, ["b", "s", K])],
                          [info("attended", onnx.TensorProto.FLOAT, ["b", "s", 64]), info("gate", onnx.TensorProto.FLOAT, ["b", "s", 16]),
                           info("up", onnx.TensorProto.FLOAT, ["b", "s", 16])], weights)
    model = ir.serde.deserialize_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21), oh.make_opsetid("com.microsoft", 1)]))
    quantize_linear_weights(model, WeightQuantization(accuracy_level=0))
    assert pack_projections(model, attention_only=True) == 1
    (split,) = [n for n in model.graph if n.op_type == "Split"]
    kernel = next(n for n in model.graph if n.op_type == "GroupQueryAttention")
    assert list(kernel.inputs[:3]) == list(split.outputs)  # the kernel's order: Q, K, V
    packed = split.inputs[0].producer()
    assert packed.attributes["N"].as_int() == 128 and packed.inputs[1].producer().op_type == "Concat"
    assert [v.name for v in packed.inputs[1].producer().inputs] == ["w_q_Q4", "w_k_Q4", "w_v_Q4"]
    assert sum(n.op_type == "MatMulNBits" for n in model.graph) == 3  # gate and up apart
