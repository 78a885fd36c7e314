"""The embedding rewrite on a hand-made graph: a token embedding's Gather becomes
GatherBlockQuantized whose onnxruntime output is the dequantized rows (padded columns
sliced off); an embedding tied to a MatMulNBits head gathers from the head's own codes."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

from fx2onnx.onnx_passes.embedding_quantization import quantize_embeddings
from fx2onnx.onnx_passes.weight_quantization import WeightQuantization, quantize_linear_weights
from conftest import dequantize_matmul_nbits as _dequantize

ort = pytest.importorskip("onnxruntime")

V = 50


def _model(k: int, tied: bool) -> tuple[onnx.ModelProto, np.ndarray]:
    table = np.random.default_rng(k).standard_normal((V, k)).astype(np.float32)
    nodes = [oh.make_node("Gather", ["embedding", "input_ids"], ["embedded"])]
    outputs = [oh.make_tensor_value_info("embedded", onnx.TensorProto.FLOAT, ["b", "s", k])]
    if tied:  # the LM head reads the same table, transposed
        nodes += [oh.make_node("Transpose", ["embedding"], ["table_t"], perm=[1, 0]),
                  oh.make_node("MatMul", ["embedded", "table_t"], ["logits"])]
        outputs.append(oh.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["b", "s", V]))
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, ["b", "s"])], outputs,
                          [onnx.numpy_helper.from_array(table, "embedding")])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21)]), table


@pytest.mark.parametrize(("k", "bits"), [(64, 4), (40, 4), (40, 8)])  # 40: padded to two blocks of 32
def test_embedding_gathers_dequantized_rows(k: int, bits: int) -> None:
    proto, table = _model(k, tied=False)
    model = ir.serde.deserialize_model(proto)
    assert quantize_embeddings(model, WeightQuantization(bits=bits)) == ["embedding"]
    written = ir.serde.serialize_model(model)
    onnx.checker.check_model(written, full_check=True)
    kinds = collections.Counter(n.op_type for n in written.graph.node)
    assert kinds["GatherBlockQuantized"] == 1 and kinds["Gather"] == 0 and kinds["Slice"] == (k % 32 != 0)
    stored = {t.name: onnx.numpy_helper.to_array(t) for t in written.graph.initializer}
    assert "embedding" not in stored
    codes, scales = stored[f"embedding_Q{bits}"], stored["embedding_scales"]
    assert codes.shape == (V, 64 * bits // 8) and scales.shape == (V, 2)
    ids = np.array([[0, 7, 49], [3, 3, 12]])
    session = ort.InferenceSession(written.SerializeToString(), providers=["CPUExecutionProvider"])
    (embedded,) = session.run(["embedded"], {"input_ids": ids})
    rows = _dequantize(codes.reshape(V, 2, -1), scales, None, bits, k).T  # MatMulNBits' codes of [V, K]
    np.testing.assert_allclose(embedded, rows[ids], rtol=1e-6, atol=1e-6)
    step = np.abs(table).max() / 2 ** (bits - 1)
    assert np.abs(embedded - table[ids]).max() <= step


def test_tied_embedding_reads_the_heads_codes() -> None:
    proto, _ = _model(64, tied=True)
    model = ir.serde.deserialize_model(proto)
    config = WeightQuantization(bits=4, accuracy_level=0)
    quantize_linear_weights(model, config)
    assert quantize_embeddings(model, config) == ["embedding"]
    written = ir.serde.serialize_model(model)
    onnx.checker.check_model(written, full_check=True)
    stored = {t.name: onnx.numpy_helper.to_array(t) for t in written.graph.initializer}
    assert "embedding" not in stored and sum(a.dtype == np.uint8 for a in stored.values()) == 1  # one set of codes
    ids = np.array([[1, 2, 3]])
    session = ort.InferenceSession(written.SerializeToString(), providers=["CPUExecutionProvider"])
    embedded, logits = session.run(["embedded", "logits"], {"input_ids": ids})
    rows = _dequantize(stored["embedding_Q4"], stored["embedding_scales"], None, 4, 64).T
    np.testing.assert_allclose(embedded, rows[ids], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(logits, embedded @ rows.T, rtol=1e-4, atol=1e-4)  # the head's weight is the same
