"""`export-hf --precision int4|int8`: a causal LM's linear layers as onnxruntime's
weight-only `MatMulNBits`, quantized as the weights are written (fake mode too); the
folder runs in onnxruntime and ONNX Runtime GenAI, is smaller than the float folder by
the expected ratio, and `--verify` reports how close it stays to the float model."""

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
from fx2onnx.hub.precision import resolve_precision
from fx2onnx.hub.verify import greedy_in_onnxruntime
from fx2onnx.onnx_passes.weight_quantization import WeightQuantization
from test_export_hf import PROMPT, generate_with_genai, save_causal_lm, tokenizer  # noqa: F401 - the fixture is used by name

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")


def _kinds(path) -> collections.Counter:
    return collections.Counter(node.op_type for node in onnx.load(os.fspath(path), load_external_data=False).graph.node)


def model_file(folder):
    """A causal-LM folder's model, where its genai_config.json names it (the file name says
    its precision, as Transformers.js names files: model.onnx, model_q4.onnx, ...)."""
    config = json.loads((folder / "genai_config.json").read_text())
    return folder / config["model"]["decoder"]["filename"]


def _folder_bytes(folder) -> int:
    path = model_file(folder)
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + "_data")))


def _initializers(path) -> dict[str, np.ndarray]:
    return {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(os.fspath(path)).graph.initializer}


def _linear_layers(model: torch.nn.Module) -> int:
    return sum(isinstance(module, torch.nn.Linear) for module in model.modules())


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer):  # noqa: F811
    """The source model and its float, int4 and int8 folders (shared: exports are slow)."""
    root = tmp_path_factory.mktemp("precision")
    model = save_causal_lm(root / "source", "llama", tokenizer)
    results = {"float": export_hf(root / "source", root / "float")}
    for precision in ("int4", "int8"):
        results[precision] = export_hf(root / "source", root / precision, precision=precision, verify=True)
    return root, model, results


@pytest.mark.parametrize(("precision", "bits"), [("int4", 4), ("int8", 8)])
def test_every_linear_layer_is_matmul_nbits(folders, precision, bits):
    root, model, results = folders
    path = model_file(root / precision)
    # named as Transformers.js names quantized files, and config.json says which to load
    names = {"int4": ("model_q4.onnx", "q4"), "int8": ("model_quantized.onnx", "q8")}[precision]
    config = json.loads((root / precision / "config.json").read_text())
    assert (path.relative_to(root / precision).as_posix(), config["transformers.js_config"]["dtype"]) == (f"onnx/{names[0]}", names[1])
    onnx.checker.check_model(os.fspath(path), full_check=True)
    kinds = _kinds(path)
    # every linear layer's weight quantized (7 per layer and the LM head), none left float
    initializers = _initializers(path)
    assert sum(name.endswith(f"_Q{bits}") for name in initializers) == _linear_layers(model) == 15
    assert kinds["MatMul"] == 0 and kinds["Transpose"] == 0
    assert kinds["MatMulNBits"] == 15
    nodes = [n for n in onnx.load(os.fspath(path), load_external_data=False).graph.node if n.op_type == "MatMulNBits"]
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert attributes["bits"] == bits and attributes["block_size"] == 32 and attributes["accuracy_level"] == 4
    assert all(len(n.input) == 3 for n in nodes)  # symmetric: no zero points
    # the embedding stays float
    assert initializers["model.embed_tokens.weight"].dtype == np.float32
    # float weights: 4 bytes per element; int4 0.5 + a float32 scale per 32 (0.125), int8 1 + 0.125
    linear_bytes = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)) * 4
    saved = _folder_bytes(root / "float") - _folder_bytes(root / precision)
    expected = linear_bytes * (1 - (0.5 + 0.125 if bits == 4 else 1 + 0.125) / 4)
    assert abs(saved - expected) < 0.02 * linear_bytes


@pytest.mark.parametrize("precision", ["int4", "int8"])
def test_quantized_folder_runs_and_stays_close_to_the_float_model(folders, precision, tokenizer):  # noqa: F811
    root, model, results = folders
    verification = results[precision].verification
    # random weights give flat logits: int8 keeps nearly every greedy token, int4 most
    assert verification.token_agreement >= (0.9 if precision == "int8" else 0.6)
    assert verification.max_logit_difference < (0.05 if precision == "int8" else 0.25) * verification.logit_scale
    assert "agree at" in verification.summary()
    # ONNX Runtime GenAI runs the folder as onnxruntime does: its greedy tokens are the
    # folder's own (decode steps over the cache, through MatMulNBits at accuracy level 4)
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    tokens, _ = generate_with_genai(root / precision, prompt_ids, 8)
    own, _ = greedy_in_onnxruntime(model_file(root / precision), prompt_ids, 8)
    assert tokens == own


@pytest.mark.parametrize(("precision", "bits"), [("int4", 4), ("int8", 8)])
def test_codes_and_scales_are_onnxruntime_quantizers_own(folders, precision, bits):
    """onnxruntime's MatMulNBitsQuantizer run on the float folder with the same settings
    writes the same codes and scales, byte for byte."""
    nbits = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    root, _, _ = folders
    quantizer = nbits.MatMulNBitsQuantizer(
        onnx.load(os.fspath(model_file(root / "float"))), bits=bits, block_size=32, is_symmetric=True, accuracy_level=4
    )
    quantizer.process()
    theirs = {t.name: onnx.numpy_helper.to_array(t) for t in quantizer.model.model.graph.initializer}
    ours = _initializers(model_file(root / precision))
    codes = [name for name in ours if name.endswith(f"_Q{bits}")]
    assert len(codes) == 15
    for name in codes:
        weight = name.removesuffix(f"_Q{bits}")
        assert ours[name].tobytes() == theirs[name].tobytes(), name
        assert ours[weight + "_scales"].tobytes() == theirs[weight + "_scales"].tobytes(), name


def test_fake_mode_writes_the_same_quantized_weights(folders, tmp_path):
    root, _, _ = folders
    export_hf(root / "source", tmp_path / "fake", precision="int4", fake=True)
    real, fake = _initializers(model_file(root / "int4")), _initializers(model_file(tmp_path / "fake"))
    assert real.keys() == fake.keys()
    assert sum(name.endswith("_Q4") for name in real) == 15
    for name, array in real.items():
        assert array.dtype == fake[name].dtype and array.tobytes() == fake[name].tobytes(), name


def test_command_line_options_float_lm_head_block_size(folders, tmp_path):
    root, _, _ = folders
    assert main(["export-hf", os.fspath(root / "source"), "--output", os.fspath(tmp_path / "out"), "--precision", "int4",
                 "--float-lm-head", "--block-size", "64", "--accuracy-level", "1", "--quiet"]) == 0
    path = model_file(tmp_path / "out")
    kinds = _kinds(path)
    assert (kinds["MatMulNBits"], kinds["MatMul"]) == (14, 1)
    nodes = [n for n in onnx.load(os.fspath(path), load_external_data=False).graph.node if n.op_type == "MatMulNBits"]
    attributes = {(a.name, onnx.helper.get_attribute_value(a)) for n in nodes for a in n.attribute}
    assert {("block_size", 64), ("accuracy_level", 1)} <= attributes and ("block_size", 32) not in attributes
    assert "lm_head.weight" in _initializers(path)


def test_packed_projections_on_request(folders, tmp_path):
    root, _, _ = folders
    export_hf(root / "source", tmp_path / "out", precision="int4", pack_projections=True)
    path = model_file(tmp_path / "out")
    initializers = _initializers(path)
    graph = onnx.load(os.fspath(path), load_external_data=False).graph
    # Q, K and V, gate and up packed (their own codes concatenated, folded by onnxruntime): 4 per layer and the head
    packing = [n for n in graph.node if n.op_type == "Concat" and all(i in initializers for i in n.input)]
    kinds = _kinds(path)
    assert (kinds["MatMulNBits"], kinds["Split"], len(packing)) == (9, 4, 8)
    nodes = [n for n in graph.node if n.op_type == "MatMulNBits"]
    packed_n = sorted(onnx.helper.get_attribute_value(a) for n in nodes for a in n.attribute if a.name == "N")
    assert packed_n == [64] * 4 + [128] * 2 + [256] * 2 + [len(initializers["model.embed_tokens.weight"])]
    # the same codes as the unpacked folder, and the same greedy tokens in onnxruntime
    unpacked = _initializers(model_file(root / "int4"))
    assert all(initializers[name].tobytes() == array.tobytes() for name, array in unpacked.items())
    prompt = [5, 9, 17, 33]
    assert greedy_in_onnxruntime(path, prompt, 8)[0] == greedy_in_onnxruntime(model_file(root / "int4"), prompt, 8)[0]


def test_precision_errors(folders, tmp_path, capsys):
    root, _, _ = folders
    with pytest.raises(ValueError, match="means dtype float16"):
        export_hf(root / "source", tmp_path / "a", precision="fp16", dtype="float32")
    with pytest.raises(ValueError, match="bfloat16"):
        export_hf(root / "source", tmp_path / "b", precision="int4", dtype="bfloat16")
    with pytest.raises(ValueError, match="power of two"):
        export_hf(root / "source", tmp_path / "c", precision="int4", block_size=48)
    assert main(["export-hf", os.fspath(root / "source"), "--output", os.fspath(tmp_path / "d"), "--precision", "int4",
                 "--block-size", "48", "--quiet"]) == 1
    assert "power of two" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_precision_and_dtype_are_one_interface():
    assert resolve_precision(None, "float16") == ("float16", None)
    assert resolve_precision("fp16", None) == ("float16", None)
    assert resolve_precision("bf16", "bfloat16") == ("bfloat16", None)
    dtype, quantization = resolve_precision("int8", None, block_size=128, accuracy_level=0, quantize_lm_head=False)
    assert dtype == "float32" and quantization == WeightQuantization(bits=8, block_size=128, accuracy_level=0, lm_head=False)
    assert resolve_precision("int4", "float16")[0] == "float16"
