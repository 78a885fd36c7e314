"""Models quantized in PyTorch (PT2E with torchao's X86 quantizer, torchao's weight-only
configs) keep their quantized form in the ONNX file, in a form onnxruntime runs with its
integer kernels, with module functions (the default) and in one flat graph alike."""

from __future__ import annotations

import collections
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import fx2onnx
from conftest import inlined, make_options

pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e", reason="torchao is not installed")
x86 = pytest.importorskip("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")


def quantized_with_x86_quantizer(model: torch.nn.Module, example: torch.Tensor) -> torch.nn.Module:
    captured = torch.export.export(model, (example,)).module()
    quantizer = x86.X86InductorQuantizer()
    quantizer.set_global(x86.get_default_x86_inductor_quantization_config())
    prepared = pt2e.prepare_pt2e(captured, quantizer)
    prepared(example)  # calibration
    return pt2e.convert_pt2e(prepared)


def run(path, x: torch.Tensor, optimized: str | None = None) -> np.ndarray:
    options = ort.SessionOptions()
    if optimized is not None:
        options.optimized_model_filepath = optimized
    session = ort.InferenceSession(os.fspath(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def exported_file(model: torch.nn.Module, x: torch.Tensor, path, module_functions: bool) -> onnx.ModelProto:
    """``model`` exported to ``path``, checked, and loaded back with its functions inlined
    (the graph onnxruntime computes, whatever the mode)."""
    options = make_options(path.parent, module_functions=module_functions)
    fx2onnx.dynamo_export(model, x, export_options=options).save(path)
    onnx.checker.check_model(os.fspath(path), full_check=True)
    saved = onnx.load(os.fspath(path))
    assert bool(saved.functions) == module_functions
    return inlined(saved)


def zero_points_are_stored_quantized(model: onnx.ModelProto) -> None:
    stored = {t.name: t.data_type for t in model.graph.initializer}
    constants = {n.output[0]: n.attribute[0].t.data_type for n in model.graph.node if n.op_type == "Constant"}
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and len(node.input) > 2:
            kind = stored.get(node.input[2], constants.get(node.input[2]))
            assert kind in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8), (node.name, kind)


def optimized_kinds(path, x: torch.Tensor, optimized) -> collections.Counter:
    run(path, x, os.fspath(optimized))
    return collections.Counter(node.op_type for node in onnx.load(os.fspath(optimized)).graph.node)


def test_a_quantized_transformer_encoder_runs_integer_matmuls(tmp_path, module_functions):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 16, 64)
    quantized = quantized_with_x86_quantizer(model, x)
    path = tmp_path / "encoder.onnx"
    saved = exported_file(quantized, x, path, module_functions)
    kinds = collections.Counter(node.op_type for node in saved.graph.node)
    # each quantized linear (two per layer: the feed-forward's) is an integer product; no
    # weight is dequantized in float any more, and none is transposed at run time
    assert kinds["MatMulInteger"] == 4
    assert optimized_kinds(path, x, tmp_path / "encoder.optimized.onnx")["MatMulInteger"] == 4
    weights = {t.name for t in saved.graph.initializer}
    assert not [n for n in saved.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in weights]
    zero_points_are_stored_quantized(saved)
    with torch.no_grad():
        expected = quantized(x).numpy()
    # the integer sum is exact; the float scaling rounds differently from eager's float product
    np.testing.assert_allclose(run(path, x), expected, rtol=1e-4, atol=1e-4)
    x2 = torch.randn(2, 16, 64)
    with torch.no_grad():
        np.testing.assert_allclose(run(path, x2), quantized(x2).numpy(), rtol=1e-4, atol=1e-4)


def test_quantized_linears_on_a_2d_input_run_in_integers(tmp_path, module_functions):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32)).eval()
    x = torch.randn(8, 64)
    quantized = quantized_with_x86_quantizer(model, x)
    path = tmp_path / "mlp.onnx"
    saved = exported_file(quantized, x, path, module_functions)
    kinds = collections.Counter(node.op_type for node in saved.graph.node)
    # the first linear's output is quantized again (through the ReLU): a Gemm onnxruntime
    # fuses into QGemm; the last one's is not, and is an integer product of its weight,
    # stored as MatMul reads it
    assert (kinds["Gemm"], kinds["MatMulInteger"]) == (1, 1)
    optimized = tmp_path / "mlp.optimized.onnx"
    got = run(path, x, os.fspath(optimized))
    fused = onnx.load(os.fspath(optimized)).graph.node
    dequantized = {n.output[0] for n in fused if n.op_type == "DequantizeLinear"}
    assert not [n for n in fused if n.op_type in ("Gemm", "MatMul") and dequantized & set(n.input)]
    assert collections.Counter(n.op_type for n in fused)["QGemm"] == 1
    with torch.no_grad():
        expected = quantized(x).numpy()
    # the integer sums are exact; the float scaling rounds differently from eager's float product
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_a_quantized_cnn_becomes_qlinearconv_with_int8_zero_points(tmp_path, module_functions):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 8, 3, padding=1),
    ).eval()
    x = torch.randn(1, 3, 16, 16)
    quantized = quantized_with_x86_quantizer(model, x)
    path = tmp_path / "cnn.onnx"
    saved = exported_file(quantized, x, path, module_functions)
    zero_points_are_stored_quantized(saved)
    assert not [n for n in saved.graph.node if n.op_type == "Cast"]  # no int64 zero point cast at run time
    optimized = tmp_path / "cnn.optimized.onnx"
    got = run(path, x, os.fspath(optimized))
    fused = collections.Counter(node.op_type for node in onnx.load(os.fspath(optimized)).graph.node)
    # the first convolution's output is quantized (Q after it): one QLinearConv; the last
    # one's is not, and it stays a convolution of dequantized operands
    assert fused["QLinearConv"] == 1
    with torch.no_grad():
        expected = quantized(x).numpy()
    # onnxruntime's QLinearConv requantizes in integers where eager dequantizes in float:
    # results differ by at most one step of the output's quantization
    step = float(np.ptp(expected)) / 255
    assert np.abs(got - expected).max() <= 1.01 * step


def _torchao_config(name: str):
    quantization = pytest.importorskip("torchao.quantization")
    granularity = pytest.importorskip("torchao.quantization.granularity")
    if name == "int8":
        return quantization.Int8WeightOnlyConfig()
    bits = torch.int4 if name.startswith("int4") else torch.int8
    group = granularity.PerGroup(32) if name == "int4-group32" else granularity.PerAxis(0)
    return quantization.IntxWeightOnlyConfig(weight_dtype=bits, granularity=group)


def _optimized_size(path, optimized) -> int:
    options = ort.SessionOptions()
    options.optimized_model_filepath = os.fspath(optimized)
    ort.InferenceSession(os.fspath(path), options, providers=["CPUExecutionProvider"])
    return os.path.getsize(optimized)


# every config with module functions (the default); the flat graph for one of each width
TORCHAO_CASES = [
    pytest.param("int8", 0.55, True, id="int8-functions"),
    pytest.param("int8-per-channel", 0.55, True, id="int8-per-channel-functions"),
    pytest.param("int4-group32", 0.35, True, id="int4-group32-functions"),
    pytest.param("int4-per-channel", 0.35, True, id="int4-per-channel-functions"),
    pytest.param("int8", 0.55, False, id="int8-flat"),
    pytest.param("int4-group32", 0.35, False, id="int4-group32-flat"),
]


@pytest.mark.parametrize(("config", "size_ratio", "functions"), TORCHAO_CASES)
def test_torchao_weight_only_models_stay_quantized_in_onnxruntime(tmp_path, config, size_ratio, functions):
    transformers = pytest.importorskip("transformers")
    quantize = pytest.importorskip("torchao.quantization").quantize_
    torch.manual_seed(0)
    llama = transformers.LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, use_cache=False)
    model = transformers.LlamaForCausalLM(llama).eval()
    ids = torch.randint(0, 128, (2, 9))
    float_path, path = tmp_path / "float.onnx", tmp_path / "quantized.onnx"
    options = make_options(tmp_path, module_functions=functions)
    fx2onnx.dynamo_export(model, ids, export_options=options).save(float_path)
    quantize(model, _torchao_config(config))
    program = fx2onnx.dynamo_export(model, ids, export_options=options)
    program.save(path)
    onnx.checker.check_model(os.fspath(path), full_check=True)
    saved = onnx.load(os.fspath(path))
    assert bool(saved.functions) == functions
    graph = inlined(saved).graph
    kinds = collections.Counter(node.op_type for node in graph.node)
    assert kinds["MatMulNBits"] == 15  # every linear layer: 7 a layer and the LM head
    weights = {t.name for t in graph.initializer}
    assert not [n for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    with torch.no_grad():
        expected = model(ids).logits
    got = torch.from_numpy(run(path, ids))
    assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()
    # what onnxruntime holds once it has loaded (inlined, folded) the model, against the float model
    ratio = _optimized_size(path, tmp_path / "q.opt.onnx") / _optimized_size(float_path, tmp_path / "f.opt.onnx")
    assert ratio <= size_ratio


def test_a_group_matmulnbits_cannot_run_stays_float_with_a_warning(tmp_path, module_functions):
    quantization = pytest.importorskip("torchao.quantization")
    granularity = pytest.importorskip("torchao.quantization.granularity")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 8)).eval()
    quantization.quantize_(model, quantization.IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=granularity.PerGroup(24)))
    x = torch.randn(3, 48)
    with pytest.warns(UserWarning, match=r"1 quantized linear layer\(s\) are dequantized to float.*groups of 24"):
        program = fx2onnx.dynamo_export(model, x, export_options=make_options(tmp_path, module_functions=module_functions))
    assert "MatMulNBits" not in {node.op_type for node in inlined(program.model_proto).graph.node}
    with torch.no_grad():
        torch.testing.assert_close(program(x), model(x), rtol=1e-5, atol=1e-5)
