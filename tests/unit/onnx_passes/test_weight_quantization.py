"""The MatMulNBits rewrite on a hand-made graph: every form of linear layer (MatMul on a
weight stored [K, N], on a Transpose of a weight an embedding shares, with its bias Add;
Gemm with transB and C) becomes one MatMulNBits whose onnxruntime output equals the
product with the dequantized weight; the codes are computed when the model is written."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

from fx2onnx.onnx_passes.derived_weights import DerivedTensor, derived_initializers
from fx2onnx.onnx_passes.weight_quantization import WeightQuantization, quantize_linear_weights
from conftest import dequantize_matmul_nbits as _dequantize

K, N, V = 64, 48, 40


def _model(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    weights = {
        "w_kn": rng.standard_normal((K, N)).astype(np.float32),  # stored as MatMul reads it
        "bias": rng.standard_normal(N).astype(np.float32),
        "w_nk": rng.standard_normal((N, K)).astype(np.float32),  # Gemm(transB=1), PyTorch's layout
        "gemm_bias": rng.standard_normal(N).astype(np.float32),
        "embedding": rng.standard_normal((V, K)).astype(np.float32),  # shared with the head
    }
    nodes = [
        oh.make_node("MatMul", ["x", "w_kn"], ["p"]),
        oh.make_node("Add", ["p", "bias"], ["linear"]),
        oh.make_node("Gemm", ["x2", "w_nk", "gemm_bias"], ["gemm"], transB=1),
        oh.make_node("Gather", ["embedding", "ids"], ["embedded"]),
        oh.make_node("Transpose", ["embedding"], ["embedding_t"], perm=[1, 0]),
        oh.make_node("MatMul", ["embedded", "embedding_t"], ["logits"]),
    ]
    float_info = oh.make_tensor_value_info
    graph = oh.make_graph(
        nodes, "g",
        [float_info("x", onnx.TensorProto.FLOAT, ["b", "s", K]), float_info("x2", onnx.TensorProto.FLOAT, ["m", K]),
         float_info("ids", onnx.TensorProto.INT64, ["b", "s"])],
        [float_info("linear", onnx.TensorProto.FLOAT, ["b", "s", N]), float_info("gemm", onnx.TensorProto.FLOAT, ["m", N]),
         float_info("logits", onnx.TensorProto.FLOAT, ["b", "s", V])],
        [onnx.numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21)]), weights


def _weight_of(model: onnx.ModelProto, node: onnx.NodeProto) -> np.ndarray:
    """W as [K, N] from a MatMulNBits node of ``model``."""
    tensors = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    return _dequantize(tensors[node.input[1]], tensors[node.input[2]], None, attributes["bits"], attributes["K"])


@pytest.mark.parametrize("bits", [4, 8])
def test_every_linear_form_becomes_matmul_nbits(bits: int) -> None:
    import onnxruntime as ort

    rng = np.random.default_rng(bits)
    proto, weights = _model(rng)
    model = ir.serde.deserialize_model(proto)
    report = quantize_linear_weights(model, WeightQuantization(bits=bits, accuracy_level=0))
    assert sorted(report.quantized) == ["embedding", "w_kn", "w_nk"]
    derived = derived_initializers(model)
    assert len(derived) == 6 and all(isinstance(t, DerivedTensor) for t in derived.values())
    # the float weights go, but the embedding its Gather still reads; the biases are inputs now
    assert {"w_kn", "w_nk"}.isdisjoint(model.graph.initializers) and "embedding" in model.graph.initializers
    written = ir.serde.serialize_model(model)  # the codes are computed here
    onnx.checker.check_model(written, full_check=True)
    kinds = collections.Counter(node.op_type for node in written.graph.node)
    assert kinds == {"MatMulNBits": 3, "Gather": 1}
    nbits = {node.output[0]: node for node in written.graph.node if node.op_type == "MatMulNBits"}
    assert list(nbits["linear"].input) == ["x", "w_kn_Q%d" % bits, "w_kn_scales", "", "", "bias"]
    x, x2 = rng.standard_normal((2, 3, K)).astype(np.float32), rng.standard_normal((5, K)).astype(np.float32)
    ids = rng.integers(0, V, (2, 3))
    session = ort.InferenceSession(written.SerializeToString(), providers=["CPUExecutionProvider"])
    linear, gemm, logits = session.run(["linear", "gemm", "logits"], {"x": x, "x2": x2, "ids": ids})
    np.testing.assert_allclose(linear, x @ _weight_of(written, nbits["linear"]) + weights["bias"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gemm, x2 @ _weight_of(written, nbits["gemm"]) + weights["gemm_bias"], rtol=1e-4, atol=1e-4)
    embedded = weights["embedding"][ids]
    np.testing.assert_allclose(logits, embedded @ _weight_of(written, nbits["logits"]), rtol=1e-4, atol=1e-4)
    # and close to the float layers: within a step (a scale) per element of the weight
    step = 2.0 * np.abs(weights["w_nk"]).max() / 2**bits
    assert np.abs(_weight_of(written, nbits["gemm"]) - weights["w_nk"].T).max() <= step + 1e-6


def test_lm_head_kept_float_on_request() -> None:
    proto, _ = _model(np.random.default_rng(0))
    model = ir.serde.deserialize_model(proto)
    report = quantize_linear_weights(model, WeightQuantization(lm_head=False))
    assert report.kept_float == ["embedding"] and sorted(report.quantized) == ["w_kn", "w_nk"]


@pytest.mark.parametrize(("head_block", "written_block"), [(64, 64), (128, 64), (16, 16)])
def test_the_lm_head_has_its_own_block_size(head_block: int, written_block: int) -> None:
    """The head's block (halved from 128 to one dividing K = 64; 16 as given); the
    other layers keep the layers' block, and the head's output is its dequantized product."""
    import onnxruntime as ort

    rng = np.random.default_rng(1)
    proto, weights = _model(rng)
    model = ir.serde.deserialize_model(proto)
    quantize_linear_weights(model, WeightQuantization(lm_head_block_size=head_block, lm_head_algorithm="search",
                                                      accuracy_level=0))
    written = ir.serde.serialize_model(model)
    onnx.checker.check_model(written, full_check=True)
    nbits = {node.output[0]: node for node in written.graph.node if node.op_type == "MatMulNBits"}
    blocks = {name: {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}["block_size"]
              for name, node in nbits.items()}
    assert blocks == {"linear": 32, "gemm": 32, "logits": written_block}
    tensors = {t.name: onnx.numpy_helper.to_array(t) for t in written.graph.initializer}
    assert tensors["embedding_scales"].size == V * K // written_block
    ids = rng.integers(0, V, (2, 3))
    session = ort.InferenceSession(written.SerializeToString(), providers=["CPUExecutionProvider"])
    (logits,) = session.run(["logits"], {"x": np.zeros((2, 3, K), np.float32), "x2": np.zeros((5, K), np.float32),
                                         "ids": ids})
    np.testing.assert_allclose(logits, weights["embedding"][ids] @ _weight_of(written, nbits["logits"]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("options", "message"), [
    (dict(bits=3), "4 or 8 bits"), (dict(block_size=24), "power of two"), (dict(accuracy_level=5), "accuracy level"),
    (dict(lm_head_block_size=48), "power of two"), (dict(lm_head_algorithm="gptq"), "algorithm is one of"),
])
def test_options_are_checked(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WeightQuantization(**options)
