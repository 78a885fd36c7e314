"""The dynamic int8 rewrite on a hand-made graph: every form of linear layer (MatMul on a
weight stored [K, N] with its bias Add, MatMul on a Transpose of a weight, Gemm with transB
and C) becomes MatMulInteger of DynamicQuantizeLinear's codes; layers on one input share
its quantization; onnxruntime's output equals the int8 arithmetic done in numpy and
onnxruntime fuses the form into its DynamicQuantizeMatMul kernels."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest
import torch

from fx2onnx.onnx_passes.derived_weights import derived_initializers
from fx2onnx.onnx_passes.dynamic_quantization import per_column_int8, quantize_linears_dynamically

ort = pytest.importorskip("onnxruntime")

K, N = 64, 48


def _model(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    weights = {
        "w_kn": rng.standard_normal((K, N)).astype(np.float32),  # stored as MatMul reads it
        "bias": rng.standard_normal(N).astype(np.float32),
        "w_nk": rng.standard_normal((N, K)).astype(np.float32),  # read through a Transpose
        "gemm_w": rng.standard_normal((N, K)).astype(np.float32),  # Gemm(transB=1), PyTorch's layout
        "gemm_bias": rng.standard_normal(N).astype(np.float32),
    }
    nodes = [
        oh.make_node("MatMul", ["x", "w_kn"], ["p"]),
        oh.make_node("Add", ["p", "bias"], ["linear"]),
        oh.make_node("Transpose", ["w_nk"], ["w_t"], perm=[1, 0]),
        oh.make_node("MatMul", ["x", "w_t"], ["shared"]),  # the same input as the first layer
        oh.make_node("Gemm", ["x2", "gemm_w", "gemm_bias"], ["gemm"], transB=1),
    ]
    info = oh.make_tensor_value_info
    graph = oh.make_graph(
        nodes, "g",
        [info("x", onnx.TensorProto.FLOAT, ["b", "s", K]), info("x2", onnx.TensorProto.FLOAT, ["m", K])],
        [info("linear", onnx.TensorProto.FLOAT, ["b", "s", N]), info("shared", onnx.TensorProto.FLOAT, ["b", "s", N]),
         info("gemm", onnx.TensorProto.FLOAT, ["m", N])],
        [onnx.numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21)]), weights


def _int8_product(x: np.ndarray, weight_kn: np.ndarray) -> np.ndarray:
    """What the rewrite computes: x quantized as DynamicQuantizeLinear does (uint8, range
    widened to 0), the weight per column (symmetric int8), the sum in integers."""
    low, high = min(0.0, float(x.min())), max(0.0, float(x.max()))
    x_scale = np.float32((high - low) / 255)
    x_zero = np.clip(np.rint(-low / x_scale), 0, 255)
    x_q = np.clip(np.rint(x / x_scale) + x_zero, 0, 255)
    codes, scales = (t.numpy() for t in per_column_int8(torch.from_numpy(weight_kn)))
    integers = (x_q - x_zero).astype(np.int64) @ codes.astype(np.int64)
    return integers.astype(np.float32) * (x_scale * scales)


def test_every_linear_form_becomes_matmul_integer(tmp_path) -> None:
    rng = np.random.default_rng(0)
    proto, weights = _model(rng)
    model = ir.serde.deserialize_model(proto)
    report = quantize_linears_dynamically(model)
    assert sorted(report.quantized) == ["gemm_w", "w_kn", "w_nk"] and not report.kept_float
    assert len(derived_initializers(model)) == 9  # codes, scales, zero points: computed when written
    assert {"w_kn", "w_nk", "gemm_w"}.isdisjoint(model.graph.initializers)  # the float weights go
    written = ir.serde.serialize_model(model)
    onnx.checker.check_model(written, full_check=True)
    kinds = collections.Counter(node.op_type for node in written.graph.node)
    # x's two layers share one DynamicQuantizeLinear; no float MatMul, Gemm or Transpose is left
    assert kinds == {"DynamicQuantizeLinear": 2, "MatMulInteger": 3, "Cast": 3, "Mul": 6, "Add": 2}
    codes = {t.name: onnx.numpy_helper.to_array(t) for t in written.graph.initializer}
    assert codes["w_kn_quantized"].dtype == np.int8 and codes["w_kn_quantized"].shape == (K, N)  # MatMul's layout
    assert not codes["w_kn_zero_point"].any() and codes["w_kn_zero_point"].dtype == np.int8

    x, x2 = rng.standard_normal((2, 3, K)).astype(np.float32), rng.standard_normal((5, K)).astype(np.float32)
    path = tmp_path / "model.onnx"
    onnx.save(written, path)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    linear, shared, gemm = session.run(["linear", "shared", "gemm"], {"x": x, "x2": x2})
    np.testing.assert_allclose(linear, _int8_product(x, weights["w_kn"]) + weights["bias"], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(shared, _int8_product(x, weights["w_nk"].T), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(gemm, _int8_product(x2, weights["gemm_w"].T) + weights["gemm_bias"], rtol=1e-5, atol=1e-4)
    # and close to the float layers: int8 on both sides keeps a few percent of the output's scale
    expected = x @ weights["w_kn"] + weights["bias"]
    assert np.abs(linear - expected).max() <= 0.03 * np.abs(expected).max()
    # onnxruntime runs it as its fused int8 kernels: no MatMulInteger and no float product left
    optimized = collections.Counter(n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node)
    assert optimized["MatMulInteger"] == 0 and optimized["MatMul"] == 0
    assert optimized["DynamicQuantizeMatMul"] + optimized["MatMulIntegerToFloat"] == 3


def test_per_column_codes_round_to_the_nearest_step() -> None:
    weight = torch.randn(K, N, generator=torch.Generator().manual_seed(1))
    weight[:, 0] = 0.0  # a column of zeros keeps zero codes (scale 0, no division by it)
    codes, scales = per_column_int8(weight)
    assert codes.dtype == torch.int8 and int(codes.abs().max()) == 127 and not codes[:, 0].any()
    error = (codes.float() * scales - weight).abs()
    assert bool((error <= scales / 2 + 1e-7).all())


def test_float16_layers_stay_float() -> None:
    proto, _ = _model(np.random.default_rng(0))
    for tensor in proto.graph.initializer:
        tensor.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(tensor).astype(np.float16), tensor.name))
    report = quantize_linears_dynamically(ir.serde.deserialize_model(proto))
    assert not report.quantized and sorted(report.kept_float) == ["gemm_w", "w_kn", "w_nk"]
