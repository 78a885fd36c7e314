"""MatMulNBits packing against onnxruntime's own kernel: the kernel's output equals the
matrix product with a numpy dequantization of the packed data (written here from the
contrib op's spec, independently of the packing code), and the dequantized weight is
within one quantization step of the float weight."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest
import torch

from conftest import dequantize_matmul_nbits as _dequantize
from fx2onnx.onnx_passes.nbits_packing import pack_weight, packed_shapes


def _run_matmul_nbits(x: np.ndarray, packed, k: int, n: int, bits: int, block: int, accuracy: int) -> np.ndarray:
    import onnxruntime as ort

    inputs = ["x", "B", "scales"] + (["zero_points"] if packed.zero_points is not None else [])
    node = oh.make_node(
        "MatMulNBits", inputs, ["y"], domain="com.microsoft", K=k, N=n, bits=bits, block_size=block, accuracy_level=accuracy
    )
    initializers = [
        onnx.numpy_helper.from_array(packed.codes.numpy(), "B"),
        onnx.numpy_helper.from_array(packed.scales.numpy(), "scales"),
    ]
    if packed.zero_points is not None:
        initializers.append(onnx.numpy_helper.from_array(packed.zero_points.numpy(), "zero_points"))
    graph = oh.make_graph(
        [node], "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [None, k])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [None, n])], initializers,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21), oh.make_opsetid("com.microsoft", 1)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize(
    ("bits", "symmetric", "k"), [(4, True, 96), (4, False, 96), (8, True, 96), (8, False, 96), (4, True, 80), (4, False, 112)]
)
def test_packing_matches_onnxruntime_kernel(bits: int, symmetric: bool, k: int) -> None:
    block, n = 32, 24
    generator = torch.Generator().manual_seed(bits * 1000 + k)
    weight = torch.randn(n, k, generator=generator)  # PyTorch's [out, in]
    packed = pack_weight(weight, bits, block, symmetric)
    codes_shape, scales_shape, zero_shape = packed_shapes(n, k, bits, block)
    assert tuple(packed.codes.shape) == codes_shape and packed.codes.dtype == torch.uint8
    assert tuple(packed.scales.shape) == scales_shape
    assert (packed.zero_points is None) == symmetric
    if packed.zero_points is not None:
        assert tuple(packed.zero_points.shape) == zero_shape
    dequantized = _dequantize(
        packed.codes.numpy(), packed.scales.numpy(), None if symmetric else packed.zero_points.numpy(), bits, k
    )
    # every element within one step of its block (the extreme maps exactly, the rest round)
    steps = np.repeat(np.abs(packed.scales.numpy()).reshape(n, -1), block, axis=1)[:, :k].T
    error = np.abs(dequantized - weight.numpy().T)
    assert (error <= steps * (1.0 if symmetric else 0.5) + 1e-6).all()
    assert error.max() > 0  # it did quantize
    x = torch.randn(5, k, generator=generator).numpy()
    # accuracy level 0/1: float activations, the kernel computes with the dequantized weight
    actual = _run_matmul_nbits(x, packed, k, n, bits, block, accuracy=0)
    np.testing.assert_allclose(actual, x @ dequantized, rtol=1e-4, atol=1e-4)


def test_accuracy_level_4_quantizes_activations_only() -> None:
    k, n, block = 128, 48, 32
    generator = torch.Generator().manual_seed(4)
    weight = torch.randn(n, k, generator=generator)
    packed = pack_weight(weight, 4, block)
    dequantized = _dequantize(packed.codes.numpy(), packed.scales.numpy(), None, 4, k)
    x = torch.randn(3, k, generator=generator).numpy()
    exact = x @ dequantized
    actual = _run_matmul_nbits(x, packed, k, n, 4, block, accuracy=4)
    # int8 activations: within a percent of the scale of the outputs
    assert np.abs(actual - exact).max() < 0.02 * np.abs(exact).max()


@pytest.mark.parametrize("symmetric", [True, False])
def test_rows_packed_in_chunks_as_at_once(monkeypatch, symmetric: bool) -> None:
    from fx2onnx.onnx_passes import nbits_packing

    weight = torch.randn(37, 80, generator=torch.Generator().manual_seed(7))
    whole = pack_weight(weight, 4, 32, symmetric)
    monkeypatch.setattr(nbits_packing, "_CHUNK_ELEMENTS", 3 * 80)  # three rows at a time, the last chunk one row
    chunked = pack_weight(weight, 4, 32, symmetric)
    assert torch.equal(whole.codes, chunked.codes) and torch.equal(whole.scales, chunked.scales)
    assert symmetric or torch.equal(whole.zero_points, chunked.zero_points)


def _onnxruntime_quantizer(weight: np.ndarray, bits: int, block: int, symmetric: bool):
    """B, scales and zero points from the quantizer MatMulNBitsQuantizer calls."""
    from onnxruntime.capi import _pybind_state

    n, k = weight.shape
    codes_shape, scales_shape, zero_shape = packed_shapes(n, k, bits, block)
    codes, scales = np.zeros(codes_shape, np.uint8), np.zeros(scales_shape, np.float32)
    zero_points = np.zeros(zero_shape, np.uint8)
    quantize = _pybind_state.quantize_matmul_4bits if bits == 4 else _pybind_state.quantize_matmul_8bits
    quantize(codes, np.ascontiguousarray(weight.T), scales, zero_points, block, n, k, symmetric)
    return codes, scales, zero_points


@pytest.mark.parametrize(("bits", "symmetric"), [(4, True), (8, True), (4, False), (8, False)])
def test_codes_equal_onnxruntime_quantizer_on_ties(bits: int, symmetric: bool) -> None:
    # Half-step values (x.5 after scaling) are where rounding rules differ: onnxruntime
    # rounds v * (1 / scale) + zero_point half away from zero, in float32.
    generator = torch.Generator().manual_seed(11)
    steps = torch.randint(-15, 16, (64, 256), generator=generator).to(torch.float32) / 2
    ties = steps / 2 ** (bits - 1)
    ties[:, ::32] = -1.0  # each block's extreme: the scale is exactly 1 / 2 ** (bits - 1)
    noisy = torch.randn(512, 768, generator=generator) * 0.02
    for weight in (ties, noisy):
        packed = pack_weight(weight, bits, 32, symmetric)
        codes, scales, zero_points = _onnxruntime_quantizer(weight.numpy(), bits, 32, symmetric)
        assert np.array_equal(packed.scales.numpy(), scales)
        assert symmetric or np.array_equal(packed.zero_points.numpy(), zero_points)
        differing = int((packed.codes.numpy() != codes).sum())
        assert differing == 0, f"{differing} of {codes.size} code bytes differ from onnxruntime's quantizer"


# torchao's weights are packed by ONNX operators in the graph, which onnxruntime folds when
# it loads the model; --precision's are packed by torch when written. Both follow one
# layout: the folded bytes are `pack_codes`'s for the same codes and scales.
TORCHAO_WEIGHTS = [
    pytest.param(torch.int4, "group", 32, "SYMMETRIC", 64, id="int4-group32"),
    pytest.param(torch.int4, "group", 32, "ASYMMETRIC", 96, id="int4-group32-zero-points-odd-blocks"),
    pytest.param(torch.int4, "group", 512, "SYMMETRIC", 1024, id="int4-group512-in-blocks-of-256"),
    pytest.param(torch.int8, "axis", None, "ASYMMETRIC", 64, id="int8-per-channel-zero-points"),
]


@pytest.mark.parametrize(("dtype", "granularity", "group", "mapping", "features"), TORCHAO_WEIGHTS)
def test_in_graph_packing_of_torchao_weights_gives_pack_codes_bytes(tmp_path, dtype, granularity, group, mapping, features):
    ort = pytest.importorskip("onnxruntime")
    quantization = pytest.importorskip("torchao.quantization")
    granularities = pytest.importorskip("torchao.quantization.granularity")
    primitives = pytest.importorskip("torchao.quantization.quant_primitives")
    import fx2onnx
    from dispatcher.functions.quantized import kernel_block
    from fx2onnx.onnx_passes.nbits_packing import pack_codes

    model = torch.nn.Sequential(torch.nn.Linear(features, 8, bias=False)).eval()
    chosen = granularities.PerGroup(group) if granularity == "group" else granularities.PerAxis(0)
    quantization.quantize_(model, quantization.IntxWeightOnlyConfig(
        weight_dtype=dtype, granularity=chosen, mapping_type=getattr(primitives.MappingType, mapping)))
    weight = model[0].weight
    x = torch.randn(3, features)
    options = fx2onnx.ExportOptions(module_functions=False, failure_report_path=None)
    path, folded = tmp_path / "m.onnx", tmp_path / "folded.onnx"
    fx2onnx.dynamo_export(model, x, export_options=options).save(path)
    session_options = ort.SessionOptions()
    session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session_options.optimized_model_filepath = str(folded)
    ort.InferenceSession(str(path), session_options, providers=["CPUExecutionProvider"])
    graph = onnx.load(str(folded)).graph
    node = next(n for n in graph.node if n.op_type == "MatMulNBits")
    stored = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    bits = 4 if dtype == torch.int4 else 8
    block = kernel_block(group or features)
    expected = pack_codes(weight.qdata, weight.scale, weight.zero_point, bits, block)
    assert expected.zero_points is not None and len(node.input) > 3
    np.testing.assert_array_equal(stored[node.input[1]], expected.codes.numpy())
    np.testing.assert_array_equal(stored[node.input[2]], expected.scales.numpy())
    np.testing.assert_array_equal(stored[node.input[3]], expected.zero_points.numpy())
