"""A decoder whose Mamba (v1) mixer scans a prompt with a Python loop over its tokens
(Mamba), exported by `export-hf --module-functions` from its short example: `--verify`
passes at lengths past the example, and the folder equals transformers in onnxruntime at 1,
2 and 33 tokens and on a left-padded batch of 2, decoding after each prompt (the recurrent
state carried between steps). The flat graph (module functions off) is covered by the
scan's unit tests (tests/unit/capture/test_transformers_selective_scans.py)."""

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


@pytest.fixture(scope="module")
def mamba_folder(tmp_path_factory):
    """A folder written with --verify and module functions."""
    root = tmp_path_factory.mktemp("mamba")
    config = transformers.MambaConfig(hidden_size=16, num_hidden_layers=1, state_size=8, expand=2, conv_kernel=4,
                                      time_step_rank=4, **IDS)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(root / "source")
    said: list[str] = []
    result = export_hf(root / "source", root / "out", task="text-generation", verify=True, tokens=NEW_TOKENS,
                       module_functions=True, say=said.append)
    return model, root / "out", result, said


def test_verify_passes_past_the_example_with_module_functions(mamba_folder):
    _, folder, result, said = mamba_folder
    assert result.verification.passed and result.verification.tokens_equal, result.verification.summary()
    assert any(line.startswith("verification lengths:") and "left-padded batch" in line for line in said), said
    assert any(line.endswith("It is for onnxruntime only.") for line in said), said
    path = os.fspath(folder / "onnx" / "model.onnx")
    onnx.checker.check_model(path, full_check=True)
    model = onnx.load(path, load_external_data=False)
    assert model.functions and "Scan" in {node.op_type for f in model.functions for node in f.node}
    assert not (folder / "genai_config.json").exists()


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
