"""The portable target in runtimes other than onnxruntime, and its structure.

OpenVINO runs every model of the zoo (tests/e2e/runtime_zoo.py) at dynamic dims, in
float32: its CPU plugin computes in bfloat16 by default on processors that have it
(2e-4 to 4e-3 off PyTorch), so every model here is compiled with
``INFERENCE_PRECISION_HINT: f32``. TVM (its Relax ONNX frontend) runs them at static
shapes, the MLP and ViT at dynamic dims too: with an attention mask built from a
``Range`` of a run-time dim (BERT, LLaMA) its shapes come apart, see docs/guides/runtimes.md.
Every model is also compared with PyTorch in onnxruntime (`export_and_compare`).
"""

from __future__ import annotations

import collections
import io
import os

import numpy as np
import onnx
import pytest
import torch

import fx2onnx
from conftest import export_and_compare_impl, flat_leaves
from runtime_zoo import ZOO, batch_norms_after_layers, constant_only_nodes
from test_export_hf import PROMPT, save_causal_lm, save_encoder, tokenizer  # noqa: F401 - tokenizer is a fixture

transformers = pytest.importorskip("transformers")

ATOL = 1e-4  # the acceptance of every runtime against PyTorch, float32
TRANSFORMERS = ("bert", "vit", "llama", "llama_decode_step")


def _openvino():
    return pytest.importorskip("openvino", reason="openvino is not installed (the test extra installs it)")


def run_in_openvino(path: os.PathLike, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs in OpenVINO's CPU plugin, in float32 (not its bfloat16 default)."""
    compiled = _openvino().Core().compile_model(os.fspath(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    names = {port.get_any_name() for port in compiled.inputs}
    results = compiled({name: value for name, value in feeds.items() if name in names})
    return [results[port] for port in compiled.outputs]


def run_in_tvm(model: onnx.ModelProto, feeds: dict[str, np.ndarray], *more_feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model compiled once by TVM's Relax ONNX frontend for the CPU, run on each of
    the feeds; the outputs of all runs in order."""
    tvm = pytest.importorskip("tvm", reason="apache-tvm is not installed (the test extra installs it on Linux x86-64)")
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    module = relax.transform.DecomposeOpsForInference()(from_onnx(model, keep_params_in_input=False))
    machine = relax.VirtualMachine(tvm.compile(module, target="llvm"), tvm.cpu())
    outputs = []
    for each in (feeds, *more_feeds):
        result = machine["main"](*[tvm.runtime.tensor(each[i.name]) for i in model.graph.input])
        outputs += [r.numpy() for r in (result if isinstance(result, (list, tuple)) or type(result).__name__ == "Array" else [result])]
    return outputs


def _expected(model: torch.nn.Module, kwargs: dict) -> list[np.ndarray]:
    with torch.no_grad():
        outputs = model(**kwargs)
    if hasattr(outputs, "to_tuple"):  # transformers' outputs, in the exported order
        outputs = outputs.to_tuple()
    return [leaf.numpy() for leaf in flat_leaves(outputs) if isinstance(leaf, torch.Tensor)]


def _feeds(model: onnx.ModelProto, kwargs: dict) -> dict[str, np.ndarray]:
    return {i.name: kwargs[i.name].numpy() for i in model.graph.input}


def _assert_close(actual: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape
        np.testing.assert_allclose(a, e, rtol=0, atol=ATOL)


def _portable(name: str, tmp_path, dynamic: bool) -> tuple[torch.nn.Module, dict, onnx.ModelProto, os.PathLike]:
    torch.manual_seed(0)
    model, kwargs = ZOO[name]()
    options = fx2onnx.ExportOptions(target="portable", dynamic_shapes=dynamic, failure_report_path=None)
    program = export_and_compare_impl(model, (), kwargs, options, tmp_path)  # onnxruntime against PyTorch
    return model, kwargs, onnx.load(os.fspath(tmp_path / "m.onnx")), tmp_path / "m.onnx"


def _second_size(name: str, kwargs: dict) -> dict:
    """Inputs of other sizes than the example's (dynamic dims), for the models that have them."""
    if name in ("bert", "llama"):
        ids = torch.randint(0, 100, (1, 11))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)} if name == "bert" else {"input_ids": ids}
    if name == "llama_decode_step":
        return {**{k: torch.randn(1, 2, 9, 8) for k in kwargs if k.startswith(("key", "value"))},
                "input_ids": torch.randint(0, 100, (1, 1)), "attention_mask": torch.ones(1, 10, dtype=torch.int64)}
    if name == "vit":
        return {"pixel_values": torch.randn(3, 3, 32, 32)}
    return {k: torch.randn(5, *v.shape[1:]) for k, v in kwargs.items()}


@pytest.mark.parametrize("name", ["cnn", "yolo", "mlp", "bert", "llama"])
def test_portable_files_are_lean(name, tmp_path):
    """No functions, no batch norm after a layer, no node computable from constants, no
    Identity; each node's module in its name and metadata."""
    _, _, model, _ = _portable(name, tmp_path, dynamic=False)
    kinds = collections.Counter(node.op_type for node in model.graph.node)
    assert not model.functions and kinds["BatchNormalization"] == 0 and batch_norms_after_layers(model) == 0
    assert constant_only_nodes(model) == [] and kinds["Identity"] == 0
    assert not {"Attention", "RotaryEmbedding", "RMSNormalization"} & set(kinds)
    assert not [d for d in model.opset_import if d.domain not in ("", "ai.onnx")]
    modules = [node for node in model.graph.node if "pkg.fx2onnx.module" in {p.key for p in node.metadata_props}]
    assert modules and all(node.name.startswith(dict((p.key, p.value) for p in node.metadata_props)["pkg.fx2onnx.module"] + "/")
                           for node in modules)
    if name in ("cnn", "yolo"):
        layers = {dict((p.key, p.value) for p in node.metadata_props)["pkg.fx2onnx.module"]
                  for node in model.graph.node if node.op_type == "Conv"}
        assert layers and all(not path.endswith(("bn", "bn1", "bn2")) for path in layers)  # the conv keeps its own name


def test_inlined_save_of_a_default_export(tmp_path):
    """The default target keeps module functions; `save(inline_functions=True)` writes a
    file without them, batch norm folded, nodes named after their module's place, that
    OpenVINO runs; the program itself keeps its functions."""
    model, kwargs = ZOO["cnn"]()
    program = fx2onnx.dynamo_export(model, **kwargs)
    assert program.model.functions and any(n.op_type == "BatchNormalization" for f in program.model.functions.values() for n in f)
    path = tmp_path / "inlined.onnx"
    program.save(path, inline_functions=True)
    onnx.checker.check_model(os.fspath(path), full_check=True)
    inlined = onnx.load(os.fspath(path))
    assert not inlined.functions and program.model.functions
    assert batch_norms_after_layers(inlined) == 0 and constant_only_nodes(inlined) == []
    assert {n.name.rsplit("/", 2)[0] for n in inlined.graph.node if n.op_type == "Conv"} >= {"layer1.0.conv1", "layer1.1.conv2"}
    expected = _expected(model, kwargs)
    _assert_close(run_in_openvino(path, _feeds(inlined, kwargs)), expected)
    import onnxruntime as ort

    _assert_close(ort.InferenceSession(os.fspath(path)).run(None, _feeds(inlined, kwargs)), expected)
    # weights from a checkpoint: batch norm stays (the checkpoint's weights are unfolded)
    stream = io.BytesIO()
    program.save(stream, inline_functions=True, model_state=model.state_dict())
    kept = onnx.load_from_string(stream.getvalue())
    assert batch_norms_after_layers(kept) == 5 and not kept.functions


def test_folded_weights_refuse_a_checkpoint(tmp_path):
    model, kwargs = ZOO["cnn"]()
    program = fx2onnx.dynamo_export(model, **kwargs, export_options=fx2onnx.ExportOptions(target="portable"))
    with pytest.raises(ValueError, match=r"computed \d+ initializer.*from its weights at export"):
        program.save(tmp_path / "m.onnx", model_state=model.state_dict())
    assert not (tmp_path / "m.onnx").exists()
    # without weight data: the weights (folded ones too) become inputs, constants stay in the file
    program.save(tmp_path / "apart.onnx", include_initializers=False)
    apart = onnx.load(os.fspath(tmp_path / "apart.onnx"))
    inputs = [i.name for i in apart.graph.input]
    assert inputs[0] == "x" and {"conv.weight", "conv.bias", "fc.weight"} <= set(inputs)
    assert [t.name for t in apart.graph.initializer] and not {t.name for t in apart.graph.initializer} & set(inputs)


@pytest.mark.parametrize("name", list(ZOO))
def test_openvino_runs_the_portable_target(name, tmp_path):
    _openvino()
    model, kwargs, onnx_model, path = _portable(name, tmp_path, dynamic=True)
    _assert_close(run_in_openvino(path, _feeds(onnx_model, kwargs)), _expected(model, kwargs))
    other = _second_size(name, kwargs)
    _assert_close(run_in_openvino(path, _feeds(onnx_model, other)), _expected(model, other))


@pytest.mark.parametrize("name", ["cnn", "yolo", "mlp", "bert", "vit", "llama_decode_step"])
def test_tvm_runs_the_portable_target(name, tmp_path):
    model, kwargs, onnx_model, _ = _portable(name, tmp_path, dynamic=False)
    _assert_close(run_in_tvm(onnx_model, _feeds(onnx_model, kwargs)), _expected(model, kwargs))


@pytest.mark.parametrize("name", ["mlp", "vit"])
def test_tvm_runs_the_portable_target_at_dynamic_dims(name, tmp_path):
    """One compilation at a symbolic batch, run at two sizes (BERT and LLaMA: see
    docs/guides/runtimes.md, TVM's Range)."""
    model, kwargs, onnx_model, _ = _portable(name, tmp_path, dynamic=True)
    assert any(d.dim_param for i in onnx_model.graph.input for d in i.type.tensor_type.shape.dim)
    other = _second_size(name, kwargs)
    _assert_close(run_in_tvm(onnx_model, _feeds(onnx_model, kwargs), _feeds(onnx_model, other)),
                  _expected(model, kwargs) + _expected(model, other))


class _MaskedAttention(torch.nn.Module):
    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=held)


def test_attention_rows_without_a_key_are_zero_in_openvino_and_tvm(tmp_path):
    """The portable target's attention (no IsNaN, dispatcher/functions/dot_product_attention.py):
    a boolean mask with a query that sees no key gives 0 there, as in PyTorch, in OpenVINO
    at dynamic dims and in TVM."""
    torch.manual_seed(0)
    held = torch.rand(2, 1, 3, 5) > 0.4
    held[0, 0, 1], held[1, 0, 2] = False, True  # a query with no key; one with every key
    kwargs = {"query": torch.randn(2, 2, 3, 8), "key": torch.randn(2, 2, 5, 8), "value": torch.randn(2, 2, 5, 8), "held": held}
    batch, length, total = (torch.export.Dim(name) for name in ("batch", "length", "total"))
    dims = {"query": {0: batch, 2: length}, "key": {0: batch, 2: total}, "value": {0: batch, 2: total},
            "held": {0: batch, 2: length, 3: total}}
    options = fx2onnx.ExportOptions(target="portable", dynamic_shapes=dims, failure_report_path=None)
    model = _MaskedAttention()
    export_and_compare_impl(model, (), kwargs, options, tmp_path)  # onnxruntime against PyTorch
    onnx_model = onnx.load(os.fspath(tmp_path / "m.onnx"))
    assert "IsNaN" not in {node.op_type for node in onnx_model.graph.node}
    expected = _expected(model, kwargs)
    assert not expected[0][0, :, 1].any()
    _assert_close(run_in_openvino(tmp_path / "m.onnx", _feeds(onnx_model, kwargs)), expected)
    _assert_close(run_in_tvm(onnx_model, _feeds(onnx_model, kwargs)), expected)


# -- export-hf folders ---------------------------------------------------------------------------------
def test_export_hf_standard_causal_lm_decodes_in_openvino(tmp_path, tokenizer):
    """`--runtime standard` (the portable target): transformers' greedy tokens in OpenVINO
    (float32), over a cache that grows from empty; the default folder holds onnxruntime's
    own GroupQueryAttention, which the check names (not a folder for OpenVINO)."""
    from fx2onnx.hub import export_hf, onnxruntime_only_operators
    from fx2onnx.hub.shared.verification import greedy_decode

    openvino = _openvino()
    model = save_causal_lm(tmp_path / "source", "llama", tokenizer)
    export_hf(tmp_path / "source", tmp_path / "standard", runtime="standard")
    path = tmp_path / "standard" / "onnx" / "model.onnx"
    assert onnxruntime_only_operators(path) == []
    compiled = openvino.Core().compile_model(os.fspath(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    inputs = {port.get_any_name() for port in compiled.inputs}

    def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = compiled({name: value for name, value in feed.items() if name in inputs})
        return {port.get_any_name(): results[port] for port in compiled.outputs}

    config = model.config
    head_size = config.hidden_size // config.num_attention_heads
    cache = {name: np.zeros((1, config.num_key_value_heads, 0, head_size), np.float32)
             for name in inputs if name.startswith("past_key_values.")}
    prompt = tokenizer(PROMPT)["input_ids"]
    tokens = greedy_decode(run, cache, [prompt], 12).tokens[0]
    with torch.no_grad():
        expected = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12, min_new_tokens=12)
    assert tokens == expected[0, len(prompt):].tolist()

    export_hf(tmp_path / "source", tmp_path / "default")
    assert onnxruntime_only_operators(tmp_path / "default" / "onnx" / "model.onnx") == ["GroupQueryAttention", "SkipSimplifiedLayerNormalization"]


def test_export_hf_standard_encoder_in_openvino(tmp_path, tokenizer):
    """A feature-extraction folder (`--runtime standard`) in OpenVINO at two sizes, padded."""
    from fx2onnx.hub import export_hf
    save_encoder(tmp_path / "source", "bert", tokenizer)
    model = transformers.AutoModel.from_pretrained(tmp_path / "source").eval()
    export_hf(tmp_path / "source", tmp_path / "out", runtime="standard")
    path = tmp_path / "out" / "onnx" / "model.onnx"
    for batch, length in ((2, 7), (1, 13)):
        ids = torch.randint(3, len(tokenizer), (batch, length))
        mask = torch.ones_like(ids)
        mask[0, length - 2:] = 0
        feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": np.zeros_like(ids.numpy())}
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
        _assert_close(run_in_openvino(path, feeds)[:1], [expected])
