"""The pytree registration of transformers' cache classes lasts one export or run and
leaves the user's registry as it was."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.utils._pytree as pytree

from fx2onnx.capture.libraries.transformers_caches import CacheOutsideLayersError, CacheState, _pytree_api, registered_containers
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


def _linear_attention_cache(initialized: tuple[int, ...] = (0,)) -> object:
    """A cache of one linear-attention layer with two conv states, those of ``initialized`` set."""
    layer = transformers.cache_utils.LinearAttentionLayer(number_of_states=2)
    for index in initialized:
        layer.update_conv_state(torch.randn(2, 6, 3), index, conv_kernel_size=4)
    cache = transformers.DynamicCache()
    cache.layers = [layer]
    return cache


def test_linear_attention_states_held_in_a_dict_are_inputs() -> None:
    """A linear-attention layer keeps its states in dicts by state index: their tensors are
    leaves (named by index), the states not initialized stay None when rebuilt."""
    cache = _linear_attention_cache()
    with registered_containers():
        leaves, spec = pytree.tree_flatten(((), {"past_key_values": cache}))
        rebuilt = pytree.tree_unflatten([leaf * 2 for leaf in leaves], spec)[1]["past_key_values"]
    assert len(leaves) == 1 and leaves[0] is cache.layers[0].conv_states[0]
    assert input_leaf_names(spec) == ["past_key_values.0.conv_states.0"]
    layer = rebuilt.layers[0]
    assert list(layer.conv_states) == [0, 1] and layer.conv_states[1] is None
    torch.testing.assert_close(layer.conv_states[0], cache.layers[0].conv_states[0] * 2)
    assert layer.is_conv_states_initialized == {0: True, 1: False}
    assert "_fx2onnx_state_keys" not in vars(layer)


class ShortConvolution(torch.nn.Module):
    """A decode step of a short convolution whose state a linear-attention cache layer keeps
    (updated in place, as transformers' hybrid models do)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(6, 6, 4, groups=6)

    def forward(self, hidden: torch.Tensor, past_key_values: object) -> tuple[torch.Tensor, torch.Tensor]:
        layer = past_key_values.layers[0]
        states = layer.update_conv_state(hidden, 0, conv_kernel_size=4)
        return self.conv(states)[..., -hidden.shape[-1]:], layer.conv_states[0]


def test_linear_attention_state_updated_in_place_exports(export_and_compare) -> None:
    """Frozen as a constant, the state made the capture fail (a constant mutated in forward)
    and would have kept the example's values: as an input, every state gives PyTorch's output."""
    cache = _linear_attention_cache()

    def eager(hidden, past_key_values):  # on a copy: the forward updates the cache in place
        return ShortConvolution.forward(model, hidden, copy.deepcopy(past_key_values))

    model = ShortConvolution().eval()
    program = export_and_compare(model, (torch.randn(2, 6, 1), cache), eager=eager,
                                 second_inputs=((torch.randn(2, 6, 1), _linear_attention_cache()), {}))
    names = [value.name for value in program.model_proto.graph.input]
    assert "past_key_values.0.conv_states.0" in names
    assert not [i for i in program.model_proto.graph.initializer if list(i.dims) == [2, 6, 4]]


def test_a_cache_with_tensors_outside_its_layers_is_refused_naming_them() -> None:
    # MiniMax keeps its linear-attention states in the cache's own list, beside its layers:
    # carried in the spec's context, they would be frozen into the exported model
    from transformers.models.minimax.modeling_minimax import MiniMaxCache

    cache = MiniMaxCache()
    cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), 0)
    cache.set_linear_cache(1, torch.randn(1, 2, 4, 4))
    with registered_containers():
        with pytest.raises(CacheOutsideLayersError, match=r"MiniMaxCache keeps tensors outside its layers \(linear_cache\)"):
            pytree.tree_flatten(cache)
        assert len(pytree.tree_leaves(_cache())) == 4  # a cache whose tensors are all in its layers


def test_an_export_given_a_cache_with_tensors_outside_its_layers_fails_under_its_own_rule() -> None:
    # the export's error names the rule of such a cache and what to do, not the generic graph-building one
    import fx2onnx
    from transformers.models.minimax.modeling_minimax import MiniMaxCache

    class ReadsTheCache(torch.nn.Module):
        def forward(self, x: torch.Tensor, cache: object) -> torch.Tensor:
            return x + cache.layers[0].keys.sum()

    cache = MiniMaxCache()
    cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), 0)
    cache.set_linear_cache(1, torch.randn(1, 2, 4, 4))
    with pytest.raises(fx2onnx.OnnxExporterError) as caught:
        fx2onnx.dynamo_export(ReadsTheCache(), torch.randn(2), cache)
    message = str(caught.value)
    assert "[FXE0028] MiniMaxCache keeps tensors outside its layers (linear_cache)" in message
    assert "FXE0019" not in message and "use_cache=False" in message
