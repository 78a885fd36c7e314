"""The pytree registration of transformers' cache classes lasts one export or run and
leaves the user's registry as it was."""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree

from fx2onnx.capture.libraries.transformers_caches import CacheState, _pytree_api, registered_containers
from fx2onnx.translate.io_names import input_leaf_names, output_leaf_names

transformers = pytest.importorskip("transformers")


def _cache(layers: int = 2) -> object:
    cache = transformers.DynamicCache()
    for index in range(layers):
        cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), index)
    return cache


def test_private_pytree_functions_are_reachable() -> None:
    register, deregister = _pytree_api()
    assert callable(register) and callable(deregister)


def test_registration_is_scoped_and_round_trips() -> None:
    assert transformers.DynamicCache not in pytree.SUPPORTED_NODES
    cache = _cache()
    with registered_containers():
        leaves, spec = pytree.tree_flatten(cache)
        assert len(leaves) == 4 and leaves[0] is cache.layers[0].keys
        rebuilt = pytree.tree_unflatten([leaf * 2 for leaf in leaves], spec)
        assert isinstance(rebuilt, transformers.DynamicCache)
        torch.testing.assert_close(rebuilt.layers[1].values, cache.layers[1].values * 2)
        assert rebuilt.get_seq_length() == 3
        with registered_containers():  # nested: registers nothing twice
            pass
        assert transformers.DynamicCache in pytree.SUPPORTED_NODES
    assert transformers.DynamicCache not in pytree.SUPPORTED_NODES
    assert transformers.DynamicLayer not in pytree.SUPPORTED_NODES


def test_registration_of_the_user_is_kept() -> None:
    def flatten(cache):
        return [layer.keys for layer in cache.layers], None

    def unflatten(children, context):
        raise AssertionError("not called")

    pytree.register_pytree_node(transformers.StaticCache, flatten, unflatten)
    try:
        with registered_containers():
            assert pytree.SUPPORTED_NODES[transformers.StaticCache].flatten_fn is flatten
        assert pytree.SUPPORTED_NODES[transformers.StaticCache].flatten_fn is flatten
    finally:
        pytree._deregister_pytree_node(transformers.StaticCache)


def test_registration_is_removed_when_the_block_raises() -> None:
    with pytest.raises(KeyError):
        with registered_containers():
            raise KeyError("x")
    assert transformers.DynamicCache not in pytree.SUPPORTED_NODES


def test_leaf_names_follow_optimum() -> None:
    encoder_decoder = transformers.EncoderDecoderCache(_cache(), _cache())
    with registered_containers():
        _, in_spec = pytree.tree_flatten(((), {"input_ids": torch.ones(1), "past_key_values": encoder_decoder}))
        _, out_spec = pytree.tree_flatten({"logits": torch.ones(1), "past_key_values": _cache(1)})
    names = input_leaf_names(in_spec)
    assert names[0] == "input_ids"
    assert names[1:5] == ["past_key_values.0.decoder.key", "past_key_values.0.decoder.value",
                          "past_key_values.1.decoder.key", "past_key_values.1.decoder.value"]
    assert names[5] == "past_key_values.0.encoder.key"
    assert output_leaf_names(out_spec) == ["logits", "present.0.key", "present.0.value"]


def test_cache_state_never_makes_two_structures_differ() -> None:
    assert CacheState({"dtype": torch.float32}) == CacheState({})


def test_cache_registered_by_transformers_itself_keeps_optimum_names() -> None:
    """transformers' own exporter registers caches as flat lists of tensors, for good."""
    cache = _cache()

    def flatten(value):
        return [t for layer in value.layers for t in (layer.keys, layer.values)], None

    pytree.register_pytree_node(transformers.DynamicCache, flatten, lambda children, context: None)
    try:
        with registered_containers():
            _, spec = pytree.tree_flatten(((), {"past_key_values": cache}))
            assert pytree.SUPPORTED_NODES[transformers.DynamicCache].flatten_fn is flatten
        assert input_leaf_names(spec) == [
            "past_key_values.0.key", "past_key_values.0.value", "past_key_values.1.key", "past_key_values.1.value"
        ]
    finally:
        pytree._deregister_pytree_node(transformers.DynamicCache)
