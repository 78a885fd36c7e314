"""transformers' caches with sliding layers as pytrees: a sliding layer rebuilt from its
tensors counts the sequence's tokens from a layer that keeps them all, and a cache whose
every layer slides and is full is noted (it cannot count them)."""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree

from fx2onnx.capture.libraries.transformers_caches import registered_containers, uncounted_sliding_caches

transformers = pytest.importorskip("transformers")

WINDOW = 4
DECODER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               head_dim=8, vocab_size=50, max_position_embeddings=64, sliding_window=WINDOW)


def prompt_cache(config, tokens: int):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        return model(input_ids=torch.randint(3, 50, (1, tokens)), use_cache=True).past_key_values


@pytest.mark.parametrize("tokens", [3, 11])
def test_a_sliding_layer_counts_the_tokens_of_a_global_one(tokens):
    cache = prompt_cache(transformers.Gemma3TextConfig(**DECODER, layer_types=["sliding_attention", "full_attention"]), tokens)
    assert [layer.keys.shape[2] for layer in cache.layers] == [min(tokens, WINDOW - 1), tokens]
    with registered_containers():
        leaves, spec = pytree.tree_flatten(cache)
        rebuilt = pytree.tree_unflatten(leaves, spec)
    assert [layer.get_seq_length() for layer in rebuilt.layers] == [tokens, tokens]
    assert rebuilt.layers[0].get_mask_sizes(1) == cache.layers[0].get_mask_sizes(1)


def test_a_full_cache_whose_every_layer_slides_is_noted():
    mistral = transformers.MistralConfig(**DECODER)
    [note] = uncounted_sliding_caches([prompt_cache(mistral, 11)])
    assert "Every layer of the DynamicCache given slides and keeps its window (sliding_window 4)" in note
    assert "DynamicCache() in the prompt's call" in note
    assert uncounted_sliding_caches([prompt_cache(mistral, 2)]) == []  # not full: it holds every token
    interleaved = transformers.Gemma3TextConfig(**DECODER, layer_types=["sliding_attention", "full_attention"])
    assert uncounted_sliding_caches([prompt_cache(interleaved, 11), torch.zeros(2)]) == []
