"""Third-party containers as pytrees: transformers' KV-cache classes.

torch.export and the IO adapters see model inputs and outputs as pytrees. transformers'
cache objects (`DynamicCache`, `StaticCache`, `EncoderDecoderCache` and their per-layer
classes) are not pytrees by default, so a model called with `use_cache=True` could not
be captured. `registered_containers()` registers them for the duration of one export (or
one run of an exported program) and removes what it added afterwards, so the user's
global pytree registry is left as it was; classes that are already registered (by the
user, transformers or torch) keep their own registration.

A cache flattens to its layers, a layer to its tensors (keys, values, then any other
tensor state such as a static layer's `cumulative_length`); everything else a cache or
layer holds is carried in the spec's context to rebuild it. Two caches of the same
classes and layer count have the same structure: their other attributes (dtype, whether
a layer was initialized, ...) never make two specs differ.

The private pytree functions this needs are reached here only (`_pytree_api`).
"""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree

# Attributes rebuilt from others when a layer is unflattened instead of being carried:
# a sliding-window layer's window as a tensor (a constant, not a model input) and its
# token count (a symbolic size while tracing; the stored length is what it counts).
_DERIVED_LAYER_ATTRIBUTES = ("_sliding_window_tensor", "cumulative_length")
_CACHE_TENSORS = ("keys", "values")
# where a layer's context keeps the keys of its dicts of states, those not initialized (None) included
_STATE_KEYS = "_fx2onnx_state_keys"


class CacheState:
    """The non-tensor attributes of a cache or layer, kept to rebuild it.

    Equal to any other CacheState: they describe one object's state, not the structure
    of the inputs, so two caches with the same layers match whatever their dtype or
    initialization flags say."""

    def __init__(self, attributes: dict[str, Any]) -> None:
        self.attributes = attributes

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CacheState)

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"CacheState({sorted(self.attributes)})"


def _transformers_cache_module() -> Any | None:
    """transformers' cache module when the program has loaded it: a model or input that
    holds a cache object has. Never imported here, which would cost every export the
    import of transformers."""
    return sys.modules.get("transformers.cache_utils")


def _subclasses(cls: type) -> Iterator[type]:
    for subclass in cls.__subclasses__():
        yield subclass
        yield from _subclasses(subclass)


# -- caches: children are layers (or, for an encoder-decoder cache, two caches) ---------
class CacheOutsideLayersError(TypeError):
    """A cache keeps tensors of its own besides its layers' (MiniMax's linear-attention
    states, `linear_cache`): carried in the spec's context, they would be frozen into the
    exported model as constants instead of being its inputs and outputs."""


def tensors_outside_layers(cache: Any) -> list[str]:
    """The attributes of ``cache`` besides its layers that hold tensors (MiniMax's `linear_cache`)."""
    return sorted(key for key, value in vars(cache).items()
                  if key != "layers" and any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(value)))


def _flatten_cache(cache: Any) -> tuple[list[Any], CacheState]:
    state = {key: value for key, value in vars(cache).items() if key != "layers"}
    held = tensors_outside_layers(cache)
    if held:
        raise CacheOutsideLayersError(
            f"{type(cache).__name__} keeps tensors outside its layers ({', '.join(held)}): fx2onnx takes a cache's "
            "layers as the model's inputs and outputs, and those tensors would be frozen into the exported model. "
            "Export the model without its cache (use_cache=False), or give it a cache that keeps every state in its "
            "layers (transformers' DynamicCache layers)."
        )
    return list(cache.layers), CacheState(state)


def _unflatten_cache(cls: type, children: Any, context: CacheState) -> Any:
    cache = cls.__new__(cls)
    cache.__dict__.update(context.attributes)
    cache.layers = list(children)
    _count_seen_tokens(cache.layers)
    return cache


def _count_seen_tokens(layers: list[Any]) -> None:
    """A sliding layer rebuilt from its tensors knows only the tokens it keeps (the last
    window - 1 once full), not how many the sequence has, which its mask's offsets need.
    Where the cache also has a layer that keeps every token (local and global layers
    interleaved), that layer's length is the count."""
    cache_utils = _transformers_cache_module()
    growing = next((layer for layer in layers if cache_utils is not None and type(layer) is cache_utils.DynamicLayer
                    and isinstance(getattr(layer, "keys", None), torch.Tensor) and layer.keys.dim() >= 2), None)
    if growing is None:
        return
    for layer in layers:
        if _derived_attributes(layer):
            layer.cumulative_length = growing.keys.shape[-2]


def uncounted_sliding_caches(values: Any) -> list[str]:
    """Notes for the caches among ``values`` whose every layer slides and is full: rebuilt
    from its tensors, such a cache cannot say how many tokens the sequence holds (no
    layer keeps them all), which the positions and the mask's offsets read."""
    notes = []
    for value in values:
        layers = getattr(value, "layers", None) if is_cache_type(type(value)) else None
        windows = [getattr(layer, "sliding_window", None) for layer in layers or []]
        if not layers or not all(isinstance(window, int) for window in windows) or any(
            isinstance(getattr(layer, "cumulative_length", None), torch.Tensor) for layer in layers
        ):
            continue
        kept = [layer.keys.shape[-2] for layer in layers if isinstance(getattr(layer, "keys", None), torch.Tensor)]
        if kept and any(int(length) >= window - 1 for length, window in zip(kept, windows)):
            notes.append(
                f"Every layer of the {type(value).__name__} given slides and keeps its window (sliding_window "
                f"{windows[0]}): the exported model cannot count the sequence's tokens from it, so its positions and "
                "masks are right only for a batch without padding and with position_ids given. Export "
                "the decode step over a cache that grows in every layer (DynamicCache() in the prompt's call) to be "
                "exact at every length."
            )
    return notes


def _flatten_encoder_decoder(cache: Any) -> tuple[list[Any], CacheState]:
    state = {
        key: value
        for key, value in vars(cache).items()
        if key not in ("self_attention_cache", "cross_attention_cache")
    }
    return [cache.self_attention_cache, cache.cross_attention_cache], CacheState(state)


def _unflatten_encoder_decoder(cls: type, children: Any, context: CacheState) -> Any:
    cache = cls.__new__(cls)
    cache.__dict__.update(context.attributes)
    cache.self_attention_cache, cache.cross_attention_cache = children
    return cache


# -- layers: children are tensors -------------------------------------------------------
def _derived_attributes(layer: Any) -> tuple[str, ...]:
    """Attributes of a dynamic sliding-window layer rebuilt on unflatten instead of carried."""
    if isinstance(getattr(layer, "sliding_window", None), int) and not isinstance(
        getattr(layer, "cumulative_length", None), torch.Tensor
    ):
        return _DERIVED_LAYER_ATTRIBUTES
    return ()


def _holds_tensors(value: Any) -> bool:
    """A tensor, a list of tensors, or a dict of them by state index (a linear-attention
    layer's `conv_states`, whose states not yet initialized are None): carried in the
    context instead, its tensors would be frozen into the program as constants."""
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        states = list(value.values())
        return any(isinstance(v, torch.Tensor) for v in states) and all(v is None or isinstance(v, torch.Tensor) for v in states)
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(v, torch.Tensor) for v in value)


def layer_tensor_names(layer: Any) -> list[str]:
    """The attributes of a layer that are its pytree children, keys and values first,
    then other tensors, lists or dicts of tensors (a linear-attention layer's states)."""
    derived = _derived_attributes(layer)
    others = sorted(
        key
        for key, value in vars(layer).items()
        if _holds_tensors(value) and key not in _CACHE_TENSORS and key not in derived
    )
    return [name for name in _CACHE_TENSORS if name in vars(layer)] + others


def _is_numbers(value: Any) -> bool:
    """An int or float (not a bool), or a non-empty dict, list or tuple of them."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return len(value) > 0 and all(_is_numbers(item) for item in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def frozen_numbers(cache: Any) -> dict[str, Any]:
    """The Python numbers each layer of ``cache`` carries in its pytree context (ints and
    floats, alone or in a dict or list), by "<layer index>:<layer class>.<attribute>": a
    captured program holds them as constants. A sliding layer's token count is not among
    them: it is rebuilt from the layer's tensors."""
    found: dict[str, Any] = {}
    for index, layer in enumerate(getattr(cache, "layers", None) or []):
        skipped = set(layer_tensor_names(layer)) | set(_derived_attributes(layer))
        for key, value in vars(layer).items():
            if key not in skipped and _is_numbers(value):
                found[f"{index}:{type(layer).__name__}.{key}"] = copy.deepcopy(value)
    return found


def _flatten_layer(layer: Any) -> tuple[list[Any], tuple[tuple[str, ...], CacheState]]:
    names = layer_tensor_names(layer)
    skipped = set(names) | set(_derived_attributes(layer))
    state = {key: value for key, value in vars(layer).items() if key not in skipped}
    children, key_orders = [], {}
    for name in names:
        value = getattr(layer, name)
        if isinstance(value, dict):  # its initialized states are children; the order of all its keys is kept
            key_orders[name] = tuple(value)
            value = {key: state for key, state in value.items() if state is not None}
        children.append(value)
    if key_orders:
        state[_STATE_KEYS] = key_orders
    return children, (tuple(names), CacheState(state))


def _unflatten_layer(cls: type, children: Any, context: tuple[tuple[str, ...], CacheState]) -> Any:
    names, state = context
    layer = cls.__new__(cls)
    key_orders = state.attributes.get(_STATE_KEYS, {})
    layer.__dict__.update({key: value for key, value in state.attributes.items() if key != _STATE_KEYS})
    for name, child in zip(names, children):
        if name in key_orders:
            child = {key: child.get(key) for key in key_orders[name]}
        setattr(layer, name, child)
    if _derived_attributes(layer) or (
        isinstance(getattr(layer, "sliding_window", None), int) and not hasattr(layer, "cumulative_length")
    ):
        keys = layer.keys
        layer.cumulative_length = keys.shape[-2] if isinstance(keys, torch.Tensor) and keys.dim() >= 2 else 0
        layer._sliding_window_tensor = torch.tensor(layer.sliding_window, dtype=torch.long)
    return layer


def _with_keys(flatten: Any, key_of: Any) -> Any:
    def flatten_with_keys(value: Any) -> tuple[list[tuple[Any, Any]], Any]:
        children, context = flatten(value)
        return [(key_of(value, context, i), child) for i, child in enumerate(children)], context

    return flatten_with_keys


def _cache_key(value: Any, context: Any, index: int) -> Any:
    return pytree.SequenceKey(index)


def _layer_key(value: Any, context: Any, index: int) -> Any:
    return pytree.GetAttrKey(context[0][index])


def _encoder_decoder_key(value: Any, context: Any, index: int) -> Any:
    return pytree.GetAttrKey(("self_attention_cache", "cross_attention_cache")[index])


def _registrations() -> list[tuple[type, Any, Any, Any]]:
    """(class, flatten, unflatten, flatten_with_keys) for every transformers cache class."""
    cache_utils = _transformers_cache_module()
    if cache_utils is None:
        return []
    found: list[tuple[type, Any, Any, Any]] = []
    layer_bases = [
        getattr(cache_utils, name)
        for name in ("CacheLayerMixin", "LinearAttentionCacheLayerMixin", "DummyLayer")
        if isinstance(getattr(cache_utils, name, None), type)
    ]
    layer_classes = {c for base in layer_bases for c in _subclasses(base)} | {
        base for base in layer_bases if base.__name__ == "DummyLayer"
    }
    for cls in layer_classes:
        found.append((cls, _flatten_layer, _bind(_unflatten_layer, cls), _with_keys(_flatten_layer, _layer_key)))
    encoder_decoder = cache_utils.EncoderDecoderCache
    for cls in [cache_utils.Cache, *_subclasses(cache_utils.Cache)]:
        if issubclass(cls, encoder_decoder):
            found.append(
                (cls, _flatten_encoder_decoder, _bind(_unflatten_encoder_decoder, cls),
                 _with_keys(_flatten_encoder_decoder, _encoder_decoder_key))
            )
        else:
            found.append((cls, _flatten_cache, _bind(_unflatten_cache, cls), _with_keys(_flatten_cache, _cache_key)))
    return sorted(found, key=lambda item: f"{item[0].__module__}.{item[0].__qualname__}")


def _bind(unflatten: Any, cls: type) -> Any:
    def bound(children: Any, context: Any) -> Any:
        return unflatten(cls, children, context)

    return bound


def is_cache_type(cls: type) -> bool:
    """Whether `cls` is one of transformers' cache classes (not a layer)."""
    cache_utils = _transformers_cache_module()
    return cache_utils is not None and isinstance(cls, type) and issubclass(cls, cache_utils.Cache)


def is_encoder_decoder_cache_type(cls: type) -> bool:
    cache_utils = _transformers_cache_module()
    return cache_utils is not None and isinstance(cls, type) and issubclass(cls, cache_utils.EncoderDecoderCache)


def _pytree_api() -> tuple[Any, Any]:
    """torch's Python-only pytree (de)registration: private, reached here only. The public
    `register_pytree_node` would also register with the C++ pytree, which cannot be undone."""
    return pytree._private_register_pytree_node, pytree._deregister_pytree_node


@contextlib.contextmanager
def registered_containers() -> Iterator[None]:
    """Register transformers' cache classes as pytrees while the block runs.

    Classes already registered are left alone; classes this registered are removed on
    exit, even when the block raises. Nests: an inner block registers nothing new."""
    register, deregister = _pytree_api()
    added: list[type] = []
    try:
        for cls, flatten, unflatten, flatten_with_keys in _registrations():
            if cls in pytree.SUPPORTED_NODES:
                continue
            register(
                cls,
                flatten,
                unflatten,
                serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
                flatten_with_keys_fn=flatten_with_keys,
            )
            added.append(cls)
        yield
    finally:
        for cls in reversed(added):
            deregister(cls)
