"""Decoders whose Mamba2-style mixer scans a prompt in chunks of `chunk_size` tokens
(Nemotron-H, a hybrid with an attention layer; Mamba2), exported by `export-hf` from its
short example: equal to transformers in onnxruntime below, at, just past and at more than
twice the chunk, and decoding after the longest prompt. `--verify` reads a prompt past the
chunk and fails on a folder that crashes there (the scan captured with the example's one
chunk, as it was before its capture rewrite)."""

from __future__ import annotations

import re

import pytest
import torch

from fx2onnx.capture import library_adapters
from fx2onnx.cli.main import main
from greedy_against_transformers import assert_greedy_equal, assert_verified_past, verified_folder

transformers = pytest.importorskip("transformers")

CHUNK = 8
IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0, vocab_size=100)
# below, at, just past and more than twice the chunk
PROMPTS = (CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 3)
NEW_TOKENS = 4


def chunked_config(family: str):
    if family == "nemotron_h":
        return transformers.NemotronHConfig(
            hidden_size=32, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, intermediate_size=64, ssm_state_size=8, mamba_num_heads=4, mamba_head_dim=8,
            n_groups=1, chunk_size=CHUNK, max_position_embeddings=128, **IDS)
    return transformers.Mamba2Config(hidden_size=32, num_hidden_layers=1, num_heads=4, head_dim=16, n_groups=2, state_size=8,
                                     chunk_size=CHUNK, expand=2, **IDS)


def source(root, family: str):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(chunked_config(family)).eval()
    model.save_pretrained(root / "source")
    return model


@pytest.fixture(scope="module", params=["nemotron_h", "mamba2"])
def chunked_folder(request, tmp_path_factory):
    """A folder written with --verify, which reads a prompt past the chunk."""
    root = tmp_path_factory.mktemp(request.param)
    model = source(root, request.param)
    result, said = verified_folder(root / "source", root / "out", NEW_TOKENS)
    return model, root / "out", result, said


def test_verify_reads_a_prompt_past_the_chunk(chunked_folder):
    _, folder, result, said = chunked_folder
    assert_verified_past(result, said, folder, f"a prompt of {CHUNK + 8} tokens (past scan chunk {CHUNK})")


@pytest.mark.parametrize("length", PROMPTS)
def test_equal_to_transformers_around_the_chunk(chunked_folder, length):
    model, folder, _, _ = chunked_folder
    assert_greedy_equal(model, folder, length, NEW_TOKENS, IDS)


def test_verify_fails_on_a_folder_whose_scan_has_the_examples_one_chunk(tmp_path, monkeypatch, capsys):
    without_rewrite = tuple(r for r in library_adapters.CAPTURE_REWRITES if r.attribute != "mamba2_chunk_scan")
    rewritten = library_adapters.rewritten_library_functions
    monkeypatch.setattr(library_adapters, "rewritten_library_functions", lambda: rewritten(without_rewrite))
    source(tmp_path, "mamba2")
    out = tmp_path / "out"
    assert main(["export-hf", str(tmp_path / "source"), "--output", str(out), "--verify", "--tokens", "4"]) == 1
    err = capsys.readouterr().err
    found = re.search(r"verification failed: onnxruntime failed at sequence length (\d+) \(the prefill\)", err)
    assert found and int(found[1]) > CHUNK, err
    assert "Traceback" not in err and (out / "onnx" / "model.onnx").is_file()
