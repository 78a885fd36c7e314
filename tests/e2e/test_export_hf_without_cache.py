"""Causal LMs without a key/value cache as text-generation folders: OpenAI GPT and
RecurrentGemma (no cache: the folder's decoder reads the whole sequence at every step;
RecurrentGemma's recurrent states and windowed attention cache stay inside its layers), RWKV
(its recurrent state as `past_state.<i>` inputs and `present_state.<i>` outputs), each equal
to transformers' greedy generation in onnxruntime; and the models export-hf refuses with
their cause (XLNet's generation inputs, xLSTM's cache)."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.decoders.verify_lengths import greedy_in_transformers
from fx2onnx.hub.shared.verification import greedy_in_folder
from fx2onnx.hub.tasks import UnsupportedTaskError
from greedy_against_transformers import assert_greedy_equal, assert_verified_past

transformers = pytest.importorskip("transformers")
IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0, vocab_size=100)
NEW_TOKENS = 8


def _saved(model, path):
    model.eval().save_pretrained(path)
    return model


def _inputs(folder) -> list[str]:
    return [value.name for value in onnx.load(os.fspath(folder / "onnx" / "model.onnx"), load_external_data=False).graph.input]


def test_openai_gpt_recomputes_the_sequence_as_transformers_generates(tmp_path):
    torch.manual_seed(0)
    model = _saved(transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig(
        n_positions=64, n_embd=16, n_layer=2, n_head=2, **IDS)), tmp_path / "source")
    said: list[str] = []
    result = export_hf(tmp_path / "source", tmp_path / "out", task="text-generation", verify=True, tokens=NEW_TOKENS,
                       module_functions=False, say=said.append)
    # --verify: one prompt and a left-padded batch, every step's logits and greedy token
    assert result.verification.passed and result.verification.tokens_equal, result.verification.summary()
    folder = tmp_path / "out"
    onnx.checker.check_model(os.fspath(folder / "onnx" / "model.onnx"), full_check=True)
    assert _inputs(folder) == ["input_ids", "attention_mask", "position_ids"]  # no cache
    assert not onnx.load(os.fspath(folder / "onnx" / "model.onnx"), load_external_data=False).functions  # one flat graph
    assert not (folder / "genai_config.json").exists()
    for name in ("config.json", "generation_config.json"):
        assert json.loads((folder / name).read_text())["use_cache"] is False
    assert any("reads the whole sequence at every step" in line for line in said), said
    # a batch of two left-padded prompts, 8 greedy steps: the folder's tokens are transformers'
    prompts = [[5, 17, 33, 8, 61, 12, 40], [9, 27, 3]]
    ours = greedy_in_folder(folder / "onnx" / "model.onnx", prompts, NEW_TOKENS, pad=0, banned=[2])
    theirs = greedy_in_transformers(model, prompts, NEW_TOKENS, pad=0)
    assert ours.tokens == theirs.tokens
    for a, b in zip(ours.logits, theirs.logits):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)


def test_recurrent_gemma_recomputes_past_its_attention_window(tmp_path):
    """A recurrent block, then a local-attention block whose window (4) the prompts and the
    decode steps pass: --verify reads a prompt of 12 tokens and a left-padded batch, 8 steps
    each; then a prompt of 1 token whose steps cross the window."""
    torch.manual_seed(0)
    model = _saved(transformers.RecurrentGemmaForCausalLM(transformers.RecurrentGemmaConfig(
        hidden_size=16, intermediate_size=32, lru_width=16, num_hidden_layers=2, block_types=["recurrent", "attention"],
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, attention_window_size=4, conv1d_width=2, **IDS)),
        tmp_path / "source")
    said: list[str] = []
    result = export_hf(tmp_path / "source", tmp_path / "out", task="text-generation", verify=True, tokens=NEW_TOKENS,
                       say=said.append)
    folder = tmp_path / "out"
    assert_verified_past(result, said, folder, "a prompt of 12 tokens (past sliding window 4), 8 decode steps to length "
                                               "20, a left-padded batch of 12, 8, 3 tokens")
    assert any("reads the whole sequence at every step" in line for line in said), said
    assert _inputs(folder) == ["input_ids", "attention_mask", "position_ids"]  # no cache, no states
    graph = onnx.load(os.fspath(folder / "onnx" / "model.onnx"), load_external_data=False).graph
    assert "Scan" in {node.op_type for node in graph.node}  # the recurrence over the sequence
    assert_greedy_equal(model, folder, 1, NEW_TOKENS, IDS)


def test_rwkv_carries_its_state_through_prefill_and_decode_steps(tmp_path):
    torch.manual_seed(0)
    model = _saved(transformers.RwkvForCausalLM(transformers.RwkvConfig(
        hidden_size=16, num_hidden_layers=2, attention_hidden_size=16, intermediate_size=32, context_length=64, **IDS)),
        tmp_path / "source")
    said: list[str] = []
    result = export_hf(tmp_path / "source", tmp_path / "out", task="text-generation", verify=True, tokens=NEW_TOKENS,
                       module_functions=True, say=said.append)
    assert result.verification.passed and result.verification.tokens_equal, result.verification.summary()
    assert any("each row alone" in line for line in said), said
    folder = tmp_path / "out"
    onnx.checker.check_model(os.fspath(folder / "onnx" / "model.onnx"), full_check=True)
    graph = onnx.load(os.fspath(folder / "onnx" / "model.onnx"), load_external_data=False).graph
    assert [v.name for v in graph.input if v.name.startswith("past")] == [f"past_state.{i}" for i in range(5)]
    assert [v.name for v in graph.output] == ["logits", *[f"present_state.{i}" for i in range(5)]]
    assert not (folder / "genai_config.json").exists()
    functions = onnx.load(os.fspath(folder / "onnx" / "model.onnx"), load_external_data=False).functions
    assert functions and "Scan" in {node.op_type for nodes in [graph.node, *(f.node for f in functions)] for node in nodes}
    # a prompt of 1 token (the example's prefill was 5, its step 3), decode steps after
    assert_greedy_equal(model, folder, 1, 4, IDS)


def test_xlnet_is_refused_with_the_inputs_its_generation_adds(tmp_path):
    _saved(transformers.XLNetLMHeadModel(transformers.XLNetConfig(d_model=16, n_layer=1, n_head=2, d_inner=32, **IDS)),
           tmp_path / "source")
    with pytest.raises(UnsupportedTaskError, match=r"1 token\(s\) appended and input\(s\) of its own \(perm_mask, "
                                                    r"target_mapping\)") as error:
        export_hf(tmp_path / "source", tmp_path / "out", task="text-generation")
    assert "Nothing was written" in str(error.value) and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("factor", "words"), [
    (0.5, "transformers' own forward fails with ValueError: matC_old has wrong shape"),
    (2.0, "keeps its decoding state in a xLSTMCache, which is neither a transformers Cache nor a list of tensors"),
])
def test_xlstm_is_refused_with_its_cause(tmp_path, factor, words):
    """A width of 32 whose query/key width (32 x 0.5) is not the 64 xLSTMCache rounds it up
    to: transformers itself fails on the prefill; with widths it is sized for, its cache object."""
    _saved(transformers.xLSTMForCausalLM(transformers.xLSTMConfig(
        hidden_size=32, embedding_dim=32, num_heads=2, num_blocks=1, num_hidden_layers=1, qk_dim_factor=factor,
        v_dim_factor=2.0, **IDS)), tmp_path / "source")
    with pytest.raises(UnsupportedTaskError, match=words) as error:
        export_hf(tmp_path / "source", tmp_path / "out", task="text-generation")
    assert "No folder was written" in str(error.value) and not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]
