"""`export-hf --precision int4|int8`: a causal LM's linear layers as onnxruntime's
weight-only `MatMulNBits`, quantized as the weights are written (fake mode too); the
folder runs in onnxruntime and ONNX Runtime GenAI, is smaller than the float folder by
the expected ratio, and `--verify` reports how close it stays to the float model."""

from __future__ import annotations

import collections
import json
import os
import shutil

import numpy as np
import onnx
import onnx.inliner
import pytest
import torch

from conftest import ATOL, RTOL, decoder_stack_nodes
from fx2onnx.cli.main import main
from fx2onnx.hub import export_hf
from fx2onnx.hub.precision.resolution import resolve_precision
from fx2onnx.hub.shared.verification import (
    QUANTIZED_ACTIVATION_ERROR, greedy_in_onnxruntime, verify_quantized_causal_lm,
)
from fx2onnx.onnx_passes.decoder_stack_guard import EXACT_SUFFIX, STACK_GUARD
from fx2onnx.onnx_passes.weight_quantization import WeightQuantization
from test_export_hf import PROMPT, causal_configs, generate_with_genai, save_causal_lm, tokenizer  # noqa: F401 - the fixture is used by name

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")


def _kinds(path) -> collections.Counter:
    return collections.Counter(node.op_type for node in decoder_stack_nodes(onnx.load(os.fspath(path), load_external_data=False).graph))


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
    # Q, K and V one kernel a layer (their codes concatenated), which the attention reads packed
    assert kinds["MatMulNBits"] == 15 - 2 * 2 and kinds["Split"] == 0  # the Split only in the guards' exact branches
    nodes = [n for n in decoder_stack_nodes(onnx.load(os.fspath(path), load_external_data=False).graph) if n.op_type == "MatMulNBits"]
    attributes = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in nodes]
    assert all(a["bits"] == bits and a["accuracy_level"] == 4 for a in attributes)
    # the layers' blocks of 32; the LM head's 128 halved to one dividing its K (hidden size 64)
    heads = [a for n, a in zip(nodes, attributes) if n.output[0].startswith("logits")]
    assert heads and all(a["block_size"] == 64 for a in heads)
    assert all(a["block_size"] == 32 for a in attributes if a not in heads)
    # the layers symmetric (no zero points), the head with them
    assert all(len(n.input) == (4 if n.output[0].startswith("logits") else 3) for n in nodes)
    # the embedding stays float
    assert initializers["model.embed_tokens.weight"].dtype == np.float32
    # the kernel's rotary tables: one pair for every layer, the model's context of 256 positions
    tables = {name: array.shape for name, array in initializers.items() if name.startswith("rotary_")}
    assert tables == {"rotary_cos_cache_0": (256, 8), "rotary_sin_cache_0": (256, 8)}
    # float weights: 4 bytes per element; int4 0.5 + a float32 scale per block, int8 1 + that
    head = model.get_output_embeddings().weight.numel()
    layers = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)) - head
    code_bytes = 0.5 if bits == 4 else 1
    # the weights' bytes (a quantized file's graph also holds the stack's two branches, a float one not)
    saved = sum(a.nbytes for a in _initializers(model_file(root / "float")).values()) - sum(a.nbytes for a in initializers.values())
    expected = layers * (4 - code_bytes - 4 / 32) + head * (4 - code_bytes - 4 / 64)
    assert abs(saved - expected) < 0.02 * (layers + head) * 4


def test_the_quantized_bound_is_the_quantizations_own_error_and_a_wrong_scale_fails(folders, tmp_path):
    """`--verify` judges a quantized folder against the float model with its weights rounded as
    the folder stores them (quantization_error.py, computed from the float weights), by how far
    that rounding alone moves the logits: a folder with one layer's scales wrong fails, its
    reference the same."""
    root, model, results = folders
    right = results["int4"].verification
    assert right.passed and right.own_error > 0
    assert right.tolerance.atol == pytest.approx(right.own_error + QUANTIZED_ACTIVATION_ERROR * right.logit_scale)
    # the folder moves the logits as the rounding alone does; what is left is onnxruntime's int8 activations
    assert 0.5 * right.own_error < right.float_difference < 1.5 * right.own_error
    assert right.max_logit_difference < 0.5 * right.own_error
    float_weights = {name: p.clone() for name, p in model.named_parameters()}
    shutil.copytree(root / "int4", tmp_path / "broken")
    path = model_file(tmp_path / "broken")
    broken = onnx.load(os.fspath(path))
    scales = next(t for t in broken.graph.initializer if t.name == "model.layers.0.self_attn.o_proj.weight_scales")
    scales.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(scales) * 3, scales.name))
    onnx.save(broken, os.fspath(path), save_as_external_data=True, location=f"{path.name}_data")
    prompt = [5, 17, 42, 8, 9, 3]
    kept = verify_quantized_causal_lm(model_file(root / "int4"), model, model.config, prompt, 8)
    wrong = verify_quantized_causal_lm(path, model, model.config, prompt, 8)
    assert kept.passed and not wrong.passed and wrong.own_error == kept.own_error
    assert wrong.max_logit_difference > wrong.tolerance.atol
    # a bound given: judged by it, the own error not measured
    given = verify_quantized_causal_lm(path, model, model.config, prompt, 8, atol=10.0)
    assert given.passed and given.own_error is None and "rounding" not in given.summary()
    # the model's float weights are back after each measurement
    assert all(torch.equal(p, float_weights[name]) for name, p in model.named_parameters())


@pytest.mark.parametrize("precision", ["int4", "int8"])
def test_quantized_folder_runs_and_stays_close_to_the_float_model(folders, precision, tokenizer):  # noqa: F811
    root, model, results = folders
    verification = results[precision].verification
    # random weights give flat logits: int8 keeps nearly every greedy token, int4 most
    assert verification.token_agreement >= (0.9 if precision == "int8" else 0.6)
    assert verification.float_difference < (0.05 if precision == "int8" else 0.25) * verification.logit_scale
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
    (symmetric blocks of 32 for the layers; blocks of 64 with zero points for the LM head)
    writes the same codes, scales and zero points, byte for byte."""
    nbits = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    root, _, _ = folders
    theirs = {}
    for block_size, symmetric in ((32, True), (64, False)):
        quantizer = nbits.MatMulNBitsQuantizer(
            onnx.load(os.fspath(model_file(root / "float"))), bits=bits, block_size=block_size, is_symmetric=symmetric,
            accuracy_level=4
        )
        quantizer.process()
        theirs[symmetric] = {t.name: onnx.numpy_helper.to_array(t) for t in quantizer.model.model.graph.initializer}
    ours = _initializers(model_file(root / precision))
    codes = [name for name in ours if name.endswith(f"_Q{bits}")]
    assert len(codes) == 15
    assert [name for name in ours if name.endswith("_zero_points")] == ["lm_head.weight_zero_points"]
    for name in codes:
        weight = name.removesuffix(f"_Q{bits}")
        head = weight == "lm_head.weight"
        for suffix in (f"_Q{bits}", "_scales"):
            assert ours[weight + suffix].tobytes() == _theirs_of(theirs[not head], weight, suffix, ours), weight + suffix
    # the head's zero points (a row's unused half byte is padding: onnxruntime's quantizer writes 8 there)
    n, blocks, _ = ours["lm_head.weight_Q%d" % bits].shape
    assert np.array_equal(_zero_points(ours["lm_head.weight_zero_points"], n, blocks, bits),
                          _zero_points(theirs[False]["lm_head.weight_zero_points"], n, blocks, bits))


def _theirs_of(theirs: dict[str, np.ndarray], weight: str, suffix: str, ours: dict[str, np.ndarray]) -> bytes:
    """The quantizer's tensor for ``weight``: the float folder holds a layer's query, key
    and value as one joined weight (N = their three N), so each one's rows are its slice of
    the joined tensor's (MatMulNBits quantizes each row of N on its own)."""
    if weight + suffix in theirs:
        return theirs[weight + suffix].tobytes()
    layer = weight.rsplit(".self_attn.", 1)[0]
    parts = [f"{layer}.self_attn.{p}_proj.weight" for p in "qkv"]
    joined = theirs[f"{parts[0]}_qkv_packed{suffix}"]
    sizes = [ours[part + suffix].shape[0] if suffix != "_scales" else ours[part + suffix].size for part in parts]
    rows = joined.reshape(sum(sizes), -1) if suffix != "_scales" else joined.reshape(-1)
    start = sum(sizes[:parts.index(weight)])
    return np.ascontiguousarray(rows[start:start + sizes[parts.index(weight)]]).tobytes()


def _zero_points(packed: np.ndarray, n: int, blocks: int, bits: int) -> np.ndarray:
    """MatMulNBits' zero points as [N, blocks] (4-bit ones two to a byte, low nibble first)."""
    rows = packed.reshape(n, -1)
    return np.stack([rows & 0x0F, rows >> 4], axis=-1).reshape(n, -1)[:, :blocks] if bits == 4 else rows[:, :blocks]


def test_a_module_function_folder_in_fake_mode_writes_the_flat_folders_codes(folders, tmp_path, tokenizer):  # noqa: F811
    """int4 with module functions (codes and scales given to the layers' functions as
    parameters) and fake mode: the flat folder's codes byte for byte, 15 MatMulNBits once
    inlined, and ONNX Runtime GenAI generates the flat folder's tokens."""
    root, _, _ = folders
    export_hf(root / "source", tmp_path / "functions", precision="int4", module_functions=True, fake=True)
    path = model_file(tmp_path / "functions")
    onnx.checker.check_model(os.fspath(path), full_check=True)
    saved = onnx.load(os.fspath(path))
    assert saved.functions
    kinds = collections.Counter(n.op_type for n in decoder_stack_nodes(onnx.inliner.inline_local_functions(saved).graph))
    assert kinds["MatMulNBits"] == 15 and kinds["MatMul"] == 0
    flat, functions = _initializers(model_file(root / "int4")), _initializers(path)
    codes = [name for name in flat if name.endswith(("_Q4", "_scales"))]
    assert len(codes) == 30 and all(flat[name].tobytes() == functions[name].tobytes() for name in codes)
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    assert generate_with_genai(tmp_path / "functions", prompt_ids, 8)[0] == generate_with_genai(root / "int4", prompt_ids, 8)[0]


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
    assert (kinds["MatMulNBits"], kinds["MatMul"]) == (14 - 2 * 2, 1)  # Q, K and V packed
    nodes = [n for n in decoder_stack_nodes(onnx.load(os.fspath(path), load_external_data=False).graph) if n.op_type == "MatMulNBits"]
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
    # the Splits of Q, K and V inside the guard's second branch: the kernel reads them packed where it runs
    assert (kinds["MatMulNBits"], kinds["Split"], len(packing)) == (9, 2, 8)
    layers = decoder_stack_nodes(graph)
    guards = [n for n in layers if n.op_type == "If" and n.name.endswith("/unpadded_or_not")]
    branches = [{a.name: a.g for a in guard.attribute} for guard in guards]
    producers = {o: n.op_type for n in [*graph.node, *layers] for o in n.output}
    for branch in branches:
        (kernel,) = branch["then_branch"].node
        assert producers[kernel.input[0]] == "MatMulNBits" and list(kernel.input[1:3]) == ["", ""]
        assert [n.op_type for n in branch["else_branch"].node if n.op_type in ("Split", "RotaryEmbedding")] == \
            ["Split", "RotaryEmbedding", "RotaryEmbedding"]
    assert len(branches) == 2
    # the stack's first branch: the same kernels, each reading its packed projection
    (stack,) = [n for n in graph.node if n.op_type == "If"]
    fast = next(a.g for a in stack.attribute if a.name == "then_branch").node
    fast_producers = {o: n.op_type for n in [*graph.node, *fast] for o in n.output}
    kernels = [n for n in fast if n.op_type == "GroupQueryAttention"]
    assert len(kernels) == 2 and all(fast_producers[k.input[0]] == "MatMulNBits" and list(k.input[1:3]) == ["", ""]
                                     for k in kernels)
    nodes = [n for n in layers if n.op_type == "MatMulNBits"]
    packed_n = sorted(onnx.helper.get_attribute_value(a) for n in nodes for a in n.attribute if a.name == "N")
    assert packed_n == [64] * 4 + [128] * 2 + [256] * 2 + [len(initializers["model.embed_tokens.weight"])]
    # the same codes as the unpacked folder, and the same greedy tokens in onnxruntime
    unpacked = _initializers(model_file(root / "int4"))
    assert all(initializers[name].tobytes() == array.tobytes() for name, array in unpacked.items())
    prompt = [5, 9, 17, 33]
    assert greedy_in_onnxruntime(path, prompt, 8)[0] == greedy_in_onnxruntime(model_file(root / "int4"), prompt, 8)[0]
    assert generate_with_genai(tmp_path / "out", prompt, 8)[0] == greedy_in_onnxruntime(path, prompt, 8)[0]


def _embedding_gather(path, block_size: int = 32) -> onnx.NodeProto:
    graph = onnx.load(os.fspath(path), load_external_data=False).graph
    nodes = [n for n in decoder_stack_nodes(graph) if n.op_type == "GatherBlockQuantized"]
    assert len(nodes) == 1 and nodes[0].domain == "com.microsoft"
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert attributes == {"bits": 4, "block_size": block_size, "gather_axis": 0, "quantize_axis": 1}
    return nodes[0]


def _runs_in_genai_as_in_onnxruntime(folder, tokenizer) -> None:  # noqa: F811
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    assert generate_with_genai(folder, prompt_ids, 8)[0] == greedy_in_onnxruntime(model_file(folder), prompt_ids, 8)[0]


def test_quantized_embedding_on_request(folders, tmp_path, tokenizer):  # noqa: F811
    root, model, results = folders
    result = export_hf(root / "source", tmp_path / "out", precision="int4", quantize_embedding=True, verify=True)
    path = model_file(tmp_path / "out")
    onnx.checker.check_model(os.fspath(path), full_check=True)
    gather = _embedding_gather(path)
    initializers = _initializers(path)
    assert "model.embed_tokens.weight" not in initializers  # no float table left
    codes, scales = initializers[gather.input[0]], initializers[gather.input[2]]
    vocabulary, hidden = model.get_input_embeddings().weight.shape
    assert (codes.dtype, codes.shape, scales.shape) == (np.uint8, (vocabulary, hidden // 2), (vocabulary, hidden // 32))
    # the embedding's 4 bytes per element become 0.5 + a float32 scale per 32
    saved = _folder_bytes(root / "int4") - _folder_bytes(tmp_path / "out")
    assert abs(saved - vocabulary * hidden * (4 - 0.625)) < 0.02 * vocabulary * hidden * 4
    # within the int4 bound of the other int4 folders (random weights: flat logits)
    verification = result.verification
    assert verification.passed and verification.float_difference < 0.25 * verification.logit_scale
    assert verification.token_agreement >= 0.6
    _runs_in_genai_as_in_onnxruntime(tmp_path / "out", tokenizer)


def test_tied_embedding_gathers_from_the_quantized_lm_head(tmp_path, tokenizer):  # noqa: F811
    torch.manual_seed(0)
    config = causal_configs(len(tokenizer))["llama"]
    config.tie_word_embeddings = True
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(tmp_path / "source")
    tokenizer.save_pretrained(tmp_path / "source")
    result = export_hf(tmp_path / "source", tmp_path / "out", precision="int4", quantize_embedding=True, verify=True)
    path = model_file(tmp_path / "out")
    onnx.checker.check_model(os.fspath(path), full_check=True)
    graph = onnx.load(os.fspath(path), load_external_data=False).graph
    layers = decoder_stack_nodes(graph)
    producers = {output: node for node in layers for output in node.output}
    gather = _embedding_gather(path, block_size=64)  # the LM head's block
    head = next(n for n in layers if n.op_type == "MatMulNBits" and n.output[0] == f"logits{EXACT_SUFFIX}")
    # one quantization for both: the Gather reads the head's codes and scales, reshaped;
    # the float table is gone
    assert [producers[gather.input[i]].input[0] for i in (0, 2)] == [head.input[1], head.input[2]]
    assert {"lm_head.weight", "model.embed_tokens.weight"}.isdisjoint(_initializers(path))
    verification = result.verification
    assert verification.passed and verification.float_difference < 0.25 * verification.logit_scale
    _runs_in_genai_as_in_onnxruntime(tmp_path / "out", tokenizer)
    # fake mode (from the command line) reads the tied weight from the checkpoint as the head's: the same bytes
    assert main(["export-hf", os.fspath(tmp_path / "source"), "--output", os.fspath(tmp_path / "fake"), "--precision", "int4",
                 "--quantize-embedding", "--fake", "--quiet"]) == 0
    real, fake = _initializers(path), _initializers(model_file(tmp_path / "fake"))
    assert real.keys() == fake.keys() and all(array.tobytes() == fake[name].tobytes() for name, array in real.items())


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
    with pytest.raises(ValueError, match="give precision int4 or int8"):
        export_hf(root / "source", tmp_path / "e", quantize_embedding=True)
    # what rewrites the flat graph is refused with module functions, before any export
    with pytest.raises(ValueError, match="inside the embedding's function"):
        export_hf(root / "source", tmp_path / "f", precision="int4", quantize_embedding=True, module_functions=True)
    with pytest.raises(ValueError, match="pack_projections packs the MatMulNBits of one flat graph"):
        export_hf(root / "source", tmp_path / "g", precision="int4", pack_projections=True, module_functions=True)
    assert not (tmp_path / "f").exists() and not (tmp_path / "g").exists()


def test_precision_and_dtype_are_one_interface():
    assert resolve_precision(None, "float16") == ("float16", None)
    assert resolve_precision("fp16", None) == ("float16", None)
    assert resolve_precision("bf16", "bfloat16") == ("bfloat16", None)
    dtype, quantization = resolve_precision("int8", None, block_size=128, accuracy_level=0, quantize_lm_head=False)
    assert dtype == "float32" and quantization == WeightQuantization(bits=8, block_size=128, accuracy_level=0, lm_head=False)
    # no block size given: the layers' 32 and the LM head's 128; a given one is the head's too
    assert resolve_precision("int4", None)[1] == WeightQuantization(bits=4, block_size=32, lm_head_block_size=128,
                                                                   lm_head_symmetric=False)
    assert resolve_precision("int4", None, block_size=32)[1] == WeightQuantization(bits=4, block_size=32)
    # a quantized embedding gathers from the head's codes: symmetric ones
    assert resolve_precision("int4", None, quantize_embedding=True)[1].lm_head_symmetric is None
    assert resolve_precision("int4", "float16")[0] == "float16"


def _run_profiled(path, feeds: dict, prefix) -> tuple[dict, set[str]]:
    """One run's outputs by name and the names of the `If` nodes it ran."""
    options = ort.SessionOptions()
    options.enable_profiling, options.profile_file_prefix = True, os.fspath(prefix)
    session = ort.InferenceSession(os.fspath(path), options, providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    batch = feeds["input_ids"].shape[0]
    for name, value in inputs.items():  # an empty cache unless given
        if name.startswith("past_key_values") and name not in feeds:
            feeds[name] = np.zeros((batch, value.shape[1], 0, value.shape[3]), np.float32)
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    events = json.loads(open(session.end_profiling()).read())
    ran = {e["name"].removesuffix("_kernel_time") for e in events
           if e.get("cat") == "Node" and e.get("args", {}).get("op_name") == "If"}
    return outputs, ran


def test_one_guard_chooses_for_the_whole_int4_stack(folders, tmp_path):
    """int4: the layers' guards are one `If` whose first branch is the layers with their
    kernels alone and second the layers each guarded, the weights read from the main
    graph. An unpadded prompt takes the first branch; a left-padded batch and several new
    tokens over a cache at batch 2 take the second, and give the first's logits for the
    same tokens."""
    root, _, _ = folders
    path = model_file(root / "int4")
    graph = onnx.load(os.fspath(path), load_external_data=False).graph
    (stack,) = [n for n in graph.node if n.op_type == "If"]
    assert stack.name == STACK_GUARD and [o.name for o in graph.output] == list(stack.output)
    branches = {a.name: a.g for a in stack.attribute}
    fast, exact = (collections.Counter(n.op_type for n in branches[b].node) for b in ("then_branch", "else_branch"))
    assert fast["GroupQueryAttention"] == 2 and not {"If", "RotaryEmbedding", "Where", "Cos"} & set(fast)
    assert exact["If"] == 2 and not branches["then_branch"].initializer and not branches["else_branch"].initializer
    # the main graph is the condition, read from the inputs and their shapes (and the packings of
    # codes, folded at load): the embedding, every layer and the head are in the branches
    initializers = {t.name for t in graph.initializer}
    condition = [n for n in graph.node if n is not stack and n.op_type != "Constant"
                 and not (n.op_type == "Concat" and set(n.input) <= initializers)]
    assert {n.op_type for n in condition} <= {"Shape", "Gather", "Squeeze", "Cast", "Sub", "ReduceProd", "Mul", "Equal",
                                              "ReduceMin", "Range", "LessOrEqual", "And"}
    assert len(condition) <= 21 and "Gather" in fast and fast["MatMulNBits"] == 2 * 5 + 1
    # each kernel where it runs reads its layer's Q, K and V from one MatMulNBits, packed
    producers = {o: n.op_type for n in branches["then_branch"].node for o in n.output}
    assert all(producers[n.input[0]] == "MatMulNBits" and list(n.input[1:3]) == ["", ""]
               for n in branches["then_branch"].node if n.op_type == "GroupQueryAttention")
    tokens = np.array([[5, 9, 17, 33, 41, 57], [8, 12, 19, 23, 36, 44]], np.int64)
    ones = np.ones_like(tokens)
    unpadded, ran = _run_profiled(path, {"input_ids": tokens, "attention_mask": ones,
                                         "position_ids": np.arange(6)[None].repeat(2, 0)}, tmp_path / "unpadded")
    assert STACK_GUARD in ran and not [n for n in ran if n.endswith("/unpadded_or_not")]
    # row 0 padded on the left (the kernel without the bias would attend to the padding)
    ids = np.array([[0, *tokens[0]], [*tokens[1], 50]], np.int64)
    mask = np.array([[0] + [1] * 6, [1] * 7], np.int64)
    positions = np.where(mask == 1, mask.cumsum(-1) - 1, 1)
    padded, ran = _run_profiled(path, {"input_ids": ids, "attention_mask": mask, "position_ids": positions}, tmp_path / "padded")
    assert len([n for n in ran if n.endswith("/unpadded_or_not")]) == 2
    np.testing.assert_allclose(padded["logits"][0, 1:], unpadded["logits"][0], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(padded["logits"][1, :6], unpadded["logits"][1], rtol=RTOL, atol=ATOL)
    # two new tokens over a cache of four at batch 2: the kernel refuses them, the exact form runs
    first, _ = _run_profiled(path, {"input_ids": tokens[:, :4], "attention_mask": ones[:, :4],
                                    "position_ids": np.arange(4)[None].repeat(2, 0)}, tmp_path / "first")
    cache = {n.replace("present.", "past_key_values."): v for n, v in first.items() if n.startswith("present.")}
    after, ran = _run_profiled(path, {"input_ids": tokens[:, 4:], "attention_mask": ones, "position_ids": np.arange(4, 6)[None].repeat(2, 0),
                                      **cache}, tmp_path / "after")
    assert len([n for n in ran if n.endswith("/unpadded_or_not")]) == 2
    np.testing.assert_allclose(after["logits"], unpadded["logits"][:, 4:], rtol=RTOL, atol=ATOL)
