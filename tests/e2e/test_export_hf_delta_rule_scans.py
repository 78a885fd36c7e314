"""Decoders whose delta-rule layer reads a prompt in chunks of 64 tokens, a default argument
of transformers' scan function that no config names (Qwen3-Next's gated rule, a hybrid with a
full-attention layer; Kimi-Linear's rule, a decay per key channel, beside a latent-attention
layer), exported by `export-hf` from its short example: equal to transformers in onnxruntime
below, at, just past and at more than twice the chunk (Qwen3-Next), from one token and past
the chunk (Kimi-Linear), decoding after each prompt. `--verify` reads a prompt past the chunk
and a left-padded batch."""

from __future__ import annotations


import pytest
import torch

from greedy_against_transformers import assert_greedy_equal, assert_verified_past, verified_folder

transformers = pytest.importorskip("transformers")

CHUNK = 64  # torch_chunk_gated_delta_rule's default chunk_size
IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0, vocab_size=100)
NEW_TOKENS = 2


@pytest.fixture(scope="module")
def delta_rule_folder(tmp_path_factory):
    """A folder written with --verify, which reads a prompt past the chunk."""
    root = tmp_path_factory.mktemp("qwen3_next")
    config = transformers.Qwen3NextConfig(
        hidden_size=32, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, intermediate_size=32, linear_num_value_heads=4, linear_num_key_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, mlp_only_layers=[0, 1],
        max_position_embeddings=256, **IDS)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(root / "source")
    result, said = verified_folder(root / "source", root / "out", NEW_TOKENS)
    return model, root / "out", result, said


def test_verify_reads_a_prompt_past_the_chunk(delta_rule_folder):
    _, folder, result, said = delta_rule_folder
    assert_verified_past(result, said, folder, f"a prompt of {CHUNK + 8} tokens (past linear attention chunk {CHUNK})")


@pytest.mark.parametrize("length", [CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 2])
def test_equal_to_transformers_around_the_chunk(delta_rule_folder, length):
    model, folder, _, _ = delta_rule_folder
    assert_greedy_equal(model, folder, length, NEW_TOKENS, IDS)


def test_kimi_linear_past_the_chunk(tmp_path):
    """One token (below the 3-token example), then --verify's prompt of 72 and left-padded batch:
    the chunked rule's state and the latent attention's cache carried through decode steps."""
    config = transformers.KimiLinearConfig(
        hidden_size=32, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
        mlp_layer_types=["dense", "dense"], intermediate_size=32, num_attention_heads=2, num_key_value_heads=2,
        head_dim=8, kv_lora_rank=8, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=8, qk_head_dim=16,
        v_head_dim=8, linear_num_heads=2, linear_head_dim=8, linear_conv_kernel_dim=4, max_position_embeddings=256, **IDS)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(tmp_path / "source")
    result, said = verified_folder(tmp_path / "source", tmp_path / "out", NEW_TOKENS)
    assert_verified_past(result, said, tmp_path / "out", f"a prompt of {CHUNK + 8} tokens (past linear attention chunk "
                                                         f"{CHUNK}), {NEW_TOKENS} decode steps")
    assert "left-padded batch" in next(line for line in said if line.startswith("verification lengths:"))
    assert_greedy_equal(model, tmp_path / "out", 1, NEW_TOKENS, IDS)
