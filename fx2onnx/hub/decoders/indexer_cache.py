"""A sparse-attention decoder's indexer keys carried in its key cache, the one cache input per
layer beside the values that Transformers.js feeds.

GLM-MoE-DSA's layers keep, beside their keys and values, the keys of their indexer (one
vector per token, `[batch, tokens, index_head_dim]`), by which its sparse attention picks the
tokens each query attends to; the export takes them as `past_key_values.<i>.indexer_keys` and
returns `present.<i>.indexer_keys`. Transformers.js feeds a `glm_moe_dsa` cache by the
names `getKeyValueNames` gives (src/configs.js: a key and a value per layer), zeros of each
input's own shape on the first step, then every `present*` output back as `past*`.

The folder's graph therefore takes each layer's indexer keys as one more head of its key
cache: `past_key_values.<i>.key` is `[batch, heads + 1, tokens, width]`, the last head the
indexer keys, both padded with zeros to the wider of the two head sizes; `present.<i>.key`
likewise. Inside the graph a `Slice` gives the exported nodes their keys and indexer keys
again, and a `Concat` of the padded ones makes the output, so the nodes between are
unchanged (the values they read and write renamed `<name>/split` and `<name>/joined`). The
cost is one head of the key cache per layer. onnxruntime users feed the inputs the graph says;
the graph file is rewritten without loading the weights.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx
from onnx import helper

from fx2onnx.hub.decoders.graph_files import int64_constant, rename_value, rewrite_graph_file

# model types whose layers keep indexer keys that Transformers.js feeds no input for
INDEXER_KEY_TYPES = frozenset({"glm_moe_dsa"})

_INDEXER = re.compile(r"past_key_values\.(\d+)\.indexer_keys")
_HEADS, _WIDTH = 1, 3


def _static(value: onnx.ValueInfoProto, axis: int) -> int:
    return value.type.tensor_type.shape.dim[axis].dim_value


def _joined_value(like: onnx.ValueInfoProto, heads: int, width: int) -> onnx.ValueInfoProto:
    """``like`` (a key cache's value) with ``heads`` heads of ``width``."""
    shape: list[Any] = [d.dim_param or d.dim_value for d in like.type.tensor_type.shape.dim]
    shape[_HEADS], shape[_WIDTH] = heads, width
    return helper.make_tensor_value_info(like.name, like.type.tensor_type.elem_type, shape)


def join_indexer_keys(graph: onnx.GraphProto) -> list[int]:
    """Carry each layer's indexer keys in its key cache (see the module's docstring); the
    layers changed (none: ``graph`` unchanged)."""
    inputs = {value.name: value for value in graph.input}
    outputs = {value.name: value for value in graph.output}
    first: list[onnx.NodeProto] = []
    last: list[onnx.NodeProto] = []
    changed = []
    for layer in sorted(int(m.group(1)) for name in inputs if (m := _INDEXER.fullmatch(name))):
        past_key, past_index = f"past_key_values.{layer}.key", f"past_key_values.{layer}.indexer_keys"
        present_key, present_index = f"present.{layer}.key", f"present.{layer}.indexer_keys"
        if not {past_key, past_index} <= set(inputs) or not {present_key, present_index} <= set(outputs):
            continue
        heads, key_width = _static(inputs[past_key], _HEADS), _static(inputs[past_key], _WIDTH)
        index_width = _static(inputs[past_index], -1)
        if not heads or not key_width or not index_width:
            continue  # a dynamic head count or width: no static place for the indexer keys
        width = max(key_width, index_width)
        first += _split_past(graph, layer, heads, key_width, index_width)
        last += _join_present(graph, layer, key_width, index_width, width)
        joined_in = _joined_value(inputs[past_key], heads + 1, width)
        joined_out = _joined_value(outputs[present_key], heads + 1, width)
        graph.input.remove(inputs[past_index])
        graph.output.remove(outputs[present_index])
        inputs[past_key].CopyFrom(joined_in)
        outputs[present_key].CopyFrom(joined_out)
        changed.append(layer)
    if changed:  # the split reads only inputs, the join the exported nodes' outputs
        kept = list(graph.node)
        del graph.node[:]
        graph.node.extend([*first, *kept, *last])
    return changed


def _split_past(graph: onnx.GraphProto, layer: int, heads: int, key_width: int, index_width: int) -> list[onnx.NodeProto]:
    """Nodes giving the exported nodes their layer's past keys and indexer keys from the joined input."""
    key, index = f"past_key_values.{layer}.key", f"past_key_values.{layer}.indexer_keys"
    rename_value(graph, key, f"{key}/split")
    rename_value(graph, index, f"{index}/split")
    at = f"past_key_values.{layer}.joined"
    return [
        int64_constant(f"{at}/key_starts", [0, 0]), int64_constant(f"{at}/key_ends", [heads, key_width]),
        int64_constant(f"{at}/index_starts", [heads, 0]), int64_constant(f"{at}/index_ends", [heads + 1, index_width]),
        int64_constant(f"{at}/axes", [_HEADS, _WIDTH]), int64_constant(f"{at}/head_axis", [_HEADS]),
        helper.make_node("Slice", [key, f"{at}/key_starts", f"{at}/key_ends", f"{at}/axes"], [f"{key}/split"],
                         name=f"{at}/key"),
        helper.make_node("Slice", [key, f"{at}/index_starts", f"{at}/index_ends", f"{at}/axes"],
                         [f"{at}/index_head"], name=f"{at}/index"),
        helper.make_node("Squeeze", [f"{at}/index_head", f"{at}/head_axis"], [f"{index}/split"],
                         name=f"{at}/squeeze"),
    ]


def _join_present(graph: onnx.GraphProto, layer: int, key_width: int, index_width: int, width: int) -> list[onnx.NodeProto]:
    """Nodes joining the exported nodes' present keys and indexer keys into the layer's output."""
    key, index = f"present.{layer}.key", f"present.{layer}.indexer_keys"
    rename_value(graph, key, f"{key}/joined")
    rename_value(graph, index, f"{index}/joined")
    at = f"present.{layer}.joined"
    return [
        int64_constant(f"{at}/head_axis", [_HEADS]),
        int64_constant(f"{at}/key_pads", [0, 0, 0, 0, 0, 0, 0, width - key_width]),
        int64_constant(f"{at}/index_pads", [0, 0, 0, 0, 0, 0, 0, width - index_width]),
        helper.make_node("Unsqueeze", [f"{index}/joined", f"{at}/head_axis"], [f"{at}/index_head"],
                         name=f"{at}/unsqueeze"),
        helper.make_node("Pad", [f"{key}/joined", f"{at}/key_pads"], [f"{at}/key_padded"], name=f"{at}/key_pad"),
        helper.make_node("Pad", [f"{at}/index_head", f"{at}/index_pads"], [f"{at}/index_padded"],
                         name=f"{at}/index_pad"),
        helper.make_node("Concat", [f"{at}/key_padded", f"{at}/index_padded"], [key], name=f"{at}/concat",
                         axis=_HEADS),
    ]


def write_joined_indexer_keys(folder: Path, relative: str, config: Mapping[str, Any]) -> bool:
    """Rewrite the graph at ``relative`` in ``folder`` to carry its indexer keys in its key
    cache when the model type of ``config`` (a dict) is one of `INDEXER_KEY_TYPES`; False
    (nothing written) otherwise."""
    if config.get("model_type") not in INDEXER_KEY_TYPES:
        return False
    return rewrite_graph_file(folder / relative, join_indexer_keys)
