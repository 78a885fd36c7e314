"""Decoders whose Mamba (v1) mixer scans a prompt with a Python loop over its tokens
(Mamba; Falcon-Mamba, whose mixer normalizes its time steps and states; Zamba, a hybrid whose
mixer keeps one state a head beside its attention layers' key/value cache), exported by
`export-hf --module-functions` from its short example: `--verify` passes at lengths past the
example, and each folder equals transformers in onnxruntime at 1, 2 and 33 tokens and on a
left-padded batch of 2, decoding after each prompt (the recurrent states, and Zamba's cache,
carried between steps). The flat graph (module functions off) is covered by the scan's unit
tests (tests/unit/capture/test_transformers_selective_scans.py) and by Falcon-Mamba's flat
folder (tests/e2e/test_export_hf_architectures.py)."""

from __future__ import annotations

import os

import onnx
import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.decoders.verify_lengths import greedy_in_transformers
from fx2onnx.hub.shared.verification import greedy_in_folder
from greedy_against_transformers import assert_greedy_equal

transformers = pytest.importorskip("transformers")

IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0, vocab_size=100)
NEW_TOKENS = 3


# the tiniest of each: one Mamba layer; Zamba's two hybrid layers, which share their attention block
CONFIGS = {
    "mamba": lambda: transformers.MambaConfig(hidden_size=16, num_hidden_layers=1, state_size=8, expand=2, conv_kernel=4,
                                              time_step_rank=4, **IDS),
    "falcon_mamba": lambda: transformers.FalconMambaConfig(hidden_size=16, num_hidden_layers=1, state_size=8, expand=2,
                                                           conv_kernel=4, time_step_rank=4, **IDS),
    "zamba": lambda: transformers.ZambaConfig(
        hidden_size=16, num_hidden_layers=2, layers_block_type=["hybrid", "hybrid"], num_attention_heads=2,
        num_key_value_heads=2, attention_hidden_size=32, attention_head_dim=16, intermediate_size=32, mamba_d_state=8,
        mamba_dt_rank=4, n_mamba_heads=2, mamba_expand=2, **IDS),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def mamba_folder(request, tmp_path_factory):
    """A folder written with --verify and module functions."""
    root = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[request.param]()).eval()
    model.save_pretrained(root / "source")
    said: list[str] = []
    result = export_hf(root / "source", root / "out", task="text-generation", verify=True, tokens=NEW_TOKENS,
                       module_functions=True, say=said.append)
    return model, root / "out", result, said


def test_verify_passes_past_the_example_with_module_functions(mamba_folder):
    source, folder, result, said = mamba_folder
    assert result.verification.passed and result.verification.tokens_equal, result.verification.summary()
    assert any(line.startswith("verification lengths:") and "left-padded batch" in line for line in said), said
    assert any(line.endswith("It is for onnxruntime only.") for line in said), said
    path = os.fspath(folder / "onnx" / "model.onnx")
    onnx.checker.check_model(path, full_check=True)
    model = onnx.load(path, load_external_data=False)
    scanning = [f.name for f in model.functions if "Scan" in {node.op_type for node in f.node}]
    assert scanning and all("MambaMixer_" in name for name in scanning), scanning  # the scan inside the mixer's function
    assert not (folder / "genai_config.json").exists()
    config = source.config
    if config.model_type == "zamba":  # a state a head beside each layer's key/value cache
        shapes = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim] for v in model.graph.input}
        head_width = config.mamba_expand * config.hidden_size // config.n_mamba_heads
        for layer in range(config.num_hidden_layers):
            assert shapes[f"past_key_values.{layer}.key"] == [
                "batch_size", config.num_key_value_heads, "past_sequence_length", config.attention_head_dim]
            assert shapes[f"past_key_values.{layer}.recurrent_states.0"] == [
                "batch_size", config.n_mamba_heads, head_width, config.mamba_d_state]


@pytest.mark.parametrize("length", [1, 2, 33])
def test_equal_to_transformers_at_every_length(mamba_folder, length):
    model, folder, _, _ = mamba_folder
    assert_greedy_equal(model, folder, length, NEW_TOKENS, IDS)


def test_equal_to_transformers_on_a_left_padded_batch(mamba_folder):
    model, folder, _, _ = mamba_folder
    generator = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 100, (n,), generator=generator).tolist() for n in (7, 33)]
    ours = greedy_in_folder(folder / "onnx" / "model.onnx", prompts, NEW_TOKENS, pad=0, banned=[IDS["eos_token_id"]])
    theirs = greedy_in_transformers(model, prompts, NEW_TOKENS, pad=0)
    assert ours.tokens == theirs.tokens
    for a, b in zip(ours.logits, theirs.logits):
        torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), rtol=1e-4, atol=1e-5)
