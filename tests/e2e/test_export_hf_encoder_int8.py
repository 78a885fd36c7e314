"""`export-hf --precision int8` of an encoder: every linear layer as `MatMulInteger` of
dynamically quantized activations (onnxruntime's `quantize_dynamic` form, fused by
onnxruntime into its int8 kernels); the folder runs in onnxruntime, stays within int8's
measured distance of PyTorch, `--verify` reports that distance, and the quantizations
that do not apply to an encoder are refused with what to do."""

from __future__ import annotations

import collections
import json
import os

import numpy as np
import onnx
import pytest
import torch

from fx2onnx.cli.main import main
from fx2onnx.hub import export_hf
from fx2onnx.hub.shared.verification import QUANTIZED_OUTPUT_ERROR
from test_export_hf import save_encoder, tokenizer  # noqa: F401 - the fixture is used by name

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def bert(tmp_path_factory, tokenizer):  # noqa: F811
    """A two-layer BERT and its float and int8 folders (shared: exports are slow)."""
    root = tmp_path_factory.mktemp("encoder_int8")
    save_encoder(root / "source", "bert", tokenizer)
    export_hf(root / "source", root / "float")
    result = export_hf(root / "source", root / "int8", precision="int8", verify=True)
    return root, result


def _size(path) -> int:
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + "_data")))


def test_every_linear_layer_is_matmul_integer(bert):
    root, result = bert
    path = root / "int8" / "onnx" / "model_quantized.onnx"  # Transformers.js's name for its 8-bit file
    assert result.files[:2] == ["onnx/model_quantized.onnx", "onnx/model_quantized.onnx_data"]
    assert json.loads((root / "int8" / "config.json").read_text())["transformers.js_config"]["dtype"] == "q8"
    onnx.checker.check_model(os.fspath(path), full_check=True)
    kinds = collections.Counter(n.op_type for n in onnx.load(os.fspath(path), load_external_data=False).graph.node)
    model = transformers.BertModel.from_pretrained(root / "source")
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert linears == 13 and kinds["MatMulInteger"] == linears and kinds["Cast"] >= linears
    assert kinds["MatMul"] == 0 and kinds["Gemm"] == 0
    # the linear weights go from 4 bytes to 1 (+ a scale and a zero point per column, data alignment); the embeddings stay float
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    saved = _size(root / "float" / "onnx" / "model.onnx") - _size(path)
    assert 2.8 * weights <= saved <= 3.0 * weights


def test_runs_in_onnxruntime_within_int8_distance_of_pytorch(bert, tokenizer):  # noqa: F811
    root, result = bert
    verification = result.verification
    # --verify measures instead of demanding equality: on this model 4.7e-4 of the largest output
    assert verification.passed and verification.summary().startswith("int8: largest difference")
    assert 1e-6 < verification.max_logit_difference <= QUANTIZED_OUTPUT_ERROR * verification.output_scale
    model = transformers.BertModel.from_pretrained(root / "source").eval()
    encoded = tokenizer(["int8 in onnxruntime", "a longer sentence for the second row of the batch"], padding=True,
                        return_tensors="np")
    session = ort.InferenceSession(os.fspath(root / "int8" / "onnx" / "model_quantized.onnx"),
                                   providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    feed = {k: v.astype(np.int64) for k, v in encoded.items() if k in names}
    feed.setdefault("token_type_ids", np.zeros_like(feed["input_ids"]))
    actual = session.run(["last_hidden_state"], feed)[0]
    with torch.no_grad():
        expected = model(**{k: torch.from_numpy(v) for k, v in feed.items()}).last_hidden_state.numpy()
    mask = feed["attention_mask"].astype(bool)  # padded positions are not compared
    assert np.abs(actual - expected)[mask].max() <= QUANTIZED_OUTPUT_ERROR * np.abs(expected).max()


def test_fake_mode_writes_the_same_int8_weights(bert, tmp_path):
    root, _ = bert
    export_hf(root / "source", tmp_path / "fake", precision="int8", fake=True)
    arrays = [{t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(os.fspath(f / "onnx" / "model_quantized.onnx")).graph.initializer}
              for f in (root / "int8", tmp_path / "fake")]
    assert arrays[0].keys() <= arrays[1].keys() and sum(a.dtype == np.int8 for a in arrays[0].values()) == 26
    assert all(array.tobytes() == arrays[1][name].tobytes() for name, array in arrays[0].items())
    # the real folder leaves out the biases of zeros (onnx_passes/zero_biases.py); fake mode,
    # which cannot see a weight's values at export, keeps them: zeros, and only biases
    extra = {name: arrays[1][name] for name in arrays[1].keys() - arrays[0].keys()}
    assert all(name.endswith(".bias") and not array.any() for name, array in extra.items())


def test_quantizations_an_encoder_has_not_are_refused(bert, tmp_path, capsys):
    root, _ = bert
    with pytest.raises(NotImplementedError, match="no 4-bit form; give precision int8"):
        export_hf(root / "source", tmp_path / "a", precision="int4")
    with pytest.raises(ValueError, match="an encoder's int8 takes none of them"):
        export_hf(root / "source", tmp_path / "a", precision="int8", block_size=64)
    with pytest.raises(NotImplementedError, match="drop quantize_embedding"):
        export_hf(root / "source", tmp_path / "a", precision="int8", quantize_embedding=True)
    with pytest.raises(ValueError, match="computes in float32"):
        export_hf(root / "source", tmp_path / "b", precision="int8", dtype="float16")
    save_encoder(tmp_path / "vit", "vit", None)
    assert main(["export-hf", os.fspath(tmp_path / "vit"), "--output", os.fspath(tmp_path / "c"), "--precision", "int8",
                 "--quiet"]) == 1
    assert "image-classification folders are float" in capsys.readouterr().err
    assert not any(p.name.startswith(("a", "b", "c")) for p in tmp_path.iterdir())
