"""The tools people run on exported files work on fx2onnx's files.

onnxruntime's quantizers look for a MatMul whose second input is an initializer: every
linear layer of an `export-hf` folder (flat, weights stored as MatMul reads them) and of a
`dynamo_export(..., module_functions=False)` file must be one. `bench/ecosystem_tools.py`
tables the same against torch.onnx's files."""

from __future__ import annotations

import collections
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import fx2onnx
from conftest import make_options
from test_export_hf import save_causal_lm, tokenizer  # noqa: F401 - the fixture is used by name

from fx2onnx.hub import export_hf
transformers = pytest.importorskip("transformers")
quantization = pytest.importorskip("onnxruntime.quantization")
nbits = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")


def _linear_layers(model: torch.nn.Module) -> int:
    return sum(isinstance(module, torch.nn.Linear) for module in model.modules())


def _prefill_feeds(session: ort.InferenceSession, ids: np.ndarray) -> dict[str, np.ndarray]:
    """A prompt with an empty cache, for a causal-LM folder's inputs."""
    feeds = {}
    for value in session.get_inputs():
        if value.name == "input_ids":
            feeds[value.name] = ids
        elif value.name == "attention_mask":
            feeds[value.name] = np.ones_like(ids)
        elif value.name == "position_ids":
            feeds[value.name] = np.arange(ids.shape[1], dtype=np.int64)[None].repeat(ids.shape[0], 0)
        else:  # past_key_values.*: [batch, kv heads, 0, head size]
            heads, size = value.shape[1], value.shape[3]
            feeds[value.name] = np.zeros((ids.shape[0], heads, 0, size), dtype=np.float32)
    return feeds


def test_matmul_nbits_quantizer_quantizes_every_linear_layer_of_a_folder(tmp_path, tokenizer):  # noqa: F811
    model = save_causal_lm(tmp_path / "source", "llama", tokenizer)
    export_hf(tmp_path / "source", tmp_path / "out")
    path = tmp_path / "out" / "onnx" / "model.onnx"
    float_model = onnx.load(os.fspath(path))
    quantizer = nbits.MatMulNBitsQuantizer(
        float_model, bits=4, block_size=32, is_symmetric=True, accuracy_level=4
    )
    quantizer.process()
    quantized = quantizer.model.model
    kinds = collections.Counter(node.op_type for node in quantized.graph.node)
    # every nn.Linear (7 per layer and the LM head), a layer's query, key and value one
    # MatMul of their joined weights (as the kernel reads them), and no MatMul on a weight left
    layers = model.config.num_hidden_layers
    assert kinds["MatMulNBits"] == _linear_layers(model) - 2 * layers == 15 - 2 * 2
    packed = [n for n in quantized.graph.node if n.op_type == "MatMulNBits" and "qkv_packed" in n.input[1]]
    heads = model.config.num_attention_heads + 2 * model.config.num_key_value_heads
    head_size = model.config.hidden_size // model.config.num_attention_heads
    assert [next(a.i for a in n.attribute if a.name == "N") for n in packed] == [heads * head_size] * layers
    weights = {t.name for t in quantized.graph.initializer}
    assert not [n for n in quantized.graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    quantized_path = tmp_path / "int4.onnx"
    onnx.save(quantized, os.fspath(quantized_path), save_as_external_data=True)
    ids = np.array([tokenizer("the quick brown fox")["input_ids"]], dtype=np.int64)
    runs = {}
    for name, file in (("float", path), ("int4", quantized_path)):
        session = ort.InferenceSession(os.fspath(file), providers=["CPUExecutionProvider"])
        runs[name] = session.run(["logits"], _prefill_feeds(session, ids))[0]
    with torch.no_grad():
        expected = model(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(runs["float"], expected, rtol=1e-4, atol=1e-4)
    # int4 with blocks of 32 on random weights: the logits move, by much less than their spread
    assert np.abs(runs["int4"] - expected).max() < 0.25 * np.ptp(expected)


def test_quantize_dynamic_and_the_optimizer_find_every_layer_of_a_flat_export(tmp_path):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4
    )
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 100, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.int64)
    program = fx2onnx.dynamo_export(model, ids, mask, export_options=make_options(tmp_path, module_functions=False))
    path, quantized = tmp_path / "bert.onnx", tmp_path / "bert.int8.onnx"
    program.save(path)
    quantization.quantize_dynamic(os.fspath(path), os.fspath(quantized), weight_type=quantization.QuantType.QInt8)
    onnx.checker.check_model(os.fspath(quantized), full_check=True)
    kinds = collections.Counter(node.op_type for node in onnx.load(os.fspath(quantized)).graph.node)
    # torch.onnx's file of this model gives as many: one per nn.Linear (the pooler is one too)
    assert kinds["MatMulInteger"] == _linear_layers(model) == 13
    session = ort.InferenceSession(os.fspath(quantized), providers=["CPUExecutionProvider"])
    got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    with torch.no_grad():
        expected = model(ids, mask).last_hidden_state.numpy()
    # dynamic int8 on the activations and weights: close to the float model, not equal
    assert np.abs(got - expected).max() < 0.1
    # The transformers optimizer relies on onnxruntime's symbolic shape inference (which
    # reads a Constant's `value` only) to fuse each residual Add into its LayerNorm.
    from onnxruntime.transformers import optimizer

    fused = optimizer.optimize_model(os.fspath(path), model_type="bert", opt_level=0).get_fused_operator_statistics()
    assert fused["SkipLayerNormalization"] == 2 * config.num_hidden_layers
