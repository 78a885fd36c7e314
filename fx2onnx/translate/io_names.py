"""The ONNX names of input and output leaves: keyword inputs and fields of dict-like
outputs by their keys, KV caches by the names ONNX Runtime GenAI and Optimum use."""

from __future__ import annotations

from typing import Any

import torch.utils._pytree as pytree

from fx2onnx.capture.library_adapters import is_cache_type, is_encoder_decoder_cache_type

# The names ONNX Runtime GenAI and Optimum give to KV caches.
PAST_PREFIX = "past_key_values"
PRESENT_PREFIX = "present"
_LAYER_TENSOR_NAMES = {"keys": "key", "values": "value"}


def input_leaf_names(in_spec: pytree.TreeSpec | None) -> list[str | None]:
    """The ONNX name of each input leaf of `(args, kwargs)`, or None where torch.export's
    placeholder name (the parameter's name) is kept: keyword inputs by their keys
    (`attention_mask`), cache tensors as `past_key_values.<layer>.key` / `.value`
    (`.decoder.` / `.encoder.` parts for an encoder-decoder cache)."""
    if in_spec is None:
        return []
    if in_spec.type is tuple and in_spec.num_children == 2 and in_spec.child(1).type is dict:
        names = _leaf_names(in_spec.child(0), None, PAST_PREFIX)
        return names + _leaf_names(in_spec.child(1), None, PAST_PREFIX)
    return _leaf_names(in_spec, None, PAST_PREFIX)


def output_leaf_names(out_spec: pytree.TreeSpec | None) -> list[str | None]:
    """The ONNX name of each output leaf, or None to keep the node's name: fields of
    dict-like outputs by their keys (`logits`), caches as `present.<layer>.key` / `.value`."""
    if out_spec is None:
        return []
    return _leaf_names(out_spec, None, PRESENT_PREFIX)


def _join(parent: str | None, child: Any) -> str | None:
    return None if parent is None else f"{parent}.{child}"


def _child_keys(spec: pytree.TreeSpec) -> list[Any] | None:
    """Readable keys of a container's children: dict keys, named-tuple fields."""
    if isinstance(spec.type, type) and issubclass(spec.type, dict) and isinstance(spec.context, (list, tuple)):
        return list(spec.context)
    fields = getattr(spec.type, "_fields", None)
    if isinstance(fields, tuple) and len(fields) == spec.num_children:
        return list(fields)
    return None


def _leaf_names(spec: pytree.TreeSpec, name: str | None, cache_prefix: str) -> list[str | None]:
    if spec.is_leaf():
        return [name]
    if is_cache_type(spec.type) and _flat_pairs(spec):
        # registered elsewhere (transformers' own exporter) as a flat list of tensors,
        # layer by layer, keys before values; an encoder-decoder's decoder layers first
        parts = [""] if not is_encoder_decoder_cache_type(spec.type) else [".decoder", ".encoder"]
        per_part = spec.num_children // len(parts)
        return [
            f"{cache_prefix}.{(index % per_part) // 2}{parts[index // per_part]}.{('key', 'value')[index % 2]}"
            for index in range(spec.num_children)
        ]
    if is_encoder_decoder_cache_type(spec.type):
        decoder, encoder = spec.child(0), spec.child(1)
        return _cache_leaf_names(decoder, cache_prefix, ".decoder") + _cache_leaf_names(encoder, cache_prefix, ".encoder")
    if is_cache_type(spec.type):
        return _cache_leaf_names(spec, cache_prefix, "")
    keys = _child_keys(spec)
    names: list[str | None] = []
    for index in range(spec.num_children):
        key = keys[index] if keys is not None else index
        child_name = str(key) if name is None and keys is not None else _join(name, key)
        names += _leaf_names(spec.child(index), child_name, cache_prefix)
    return names


def _flat_pairs(spec: pytree.TreeSpec) -> bool:
    """A cache flattened straight to tensors: two per layer (and per side of an
    encoder-decoder cache)."""
    group = 4 if is_encoder_decoder_cache_type(spec.type) else 2
    count = spec.num_children
    return count > 0 and count % group == 0 and all(spec.child(i).is_leaf() for i in range(count))


def _cache_leaf_names(spec: pytree.TreeSpec, prefix: str, part: str) -> list[str | None]:
    """`<prefix>.<layer><part>.key` for each layer's tensors (other tensor state by its attribute)."""
    names: list[str | None] = []
    for layer_index in range(spec.num_children):
        layer = spec.child(layer_index)
        if layer.is_leaf():
            names.append(f"{prefix}.{layer_index}{part}")
            continue
        tensor_names = layer.context[0] if isinstance(layer.context, tuple) and layer.context else ()
        for index in range(layer.num_children):
            attribute = tensor_names[index] if index < len(tensor_names) else str(index)
            base = f"{prefix}.{layer_index}{part}.{_LAYER_TENSOR_NAMES.get(attribute, attribute)}"
            names += _leaf_names(layer.child(index), base, prefix)
    return names
