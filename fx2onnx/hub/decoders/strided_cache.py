"""A decoder's layers fed in groups, for a client that names a cache input only every few
layers.

Transformers.js names ZAYA's cache by the numbering of the original checkpoint, whose
attention and experts layers alternate (`getCacheNames` in src/configs.js): a key, a value, a
convolution state and a shift state for layers 0, `cca_time1`, 2 `cca_time1`, ... below
`num_hidden_layers` only, zeros of each input's own shape on the first step, then every
`present*` output back as `past*`. transformers' ZAYA attends in every layer and reads
`cca_time1` as its grouped convolution's kernel size, so `config.json` must say it as it is.

The folder's graph therefore takes each group of `cca_time1` layers' caches in the inputs of
its first layer (the names Transformers.js feeds), joined along their second dim (heads for
keys and values, channels for the states): `past_key_values.<g>.key` holds layers g, g + 1,
..., g + cca_time1 - 1 one after the other, and `present.<g>.key` likewise. Inside the graph a
`Split` gives the exported nodes each layer's cache again and a `Concat` joins their outputs,
so the nodes between are unchanged (their values renamed `<name>/split` and `<name>/joined`).
A group whose layers' caches differ in any other dim (or in a dim's name) is not joined: the
graph is then left as exported. onnxruntime users feed the inputs the graph says; the graph
file is rewritten without loading the weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx
from onnx import helper

from fx2onnx.hub.decoders.client_support import TRANSFORMERS_JS
from fx2onnx.hub.decoders.graph_files import int64_constant, rename_value, rewrite_graph_file

# model type -> the config entry giving the stride at which Transformers.js names its cache inputs
STRIDED_CACHE_TYPES = {"zaya": "cca_time1"}
# the inputs of each layer Transformers.js feeds for these types (state_names.py names the states so)
_KINDS = ("key", "value", "conv_state", "shift_state")
_AXIS = 1


UNJOINED_NOTE = (
    TRANSFORMERS_JS + " cannot load this folder: it feeds a {model_type} cache only to every {stride}-th layer "
    "(src/configs.js, getCacheNames), and this graph's layers' caches differ in shape, so they cannot be fed in "
    "groups. It is for onnxruntime only."
)


def cache_stride(config: Mapping[str, Any]) -> int:
    """The stride at which Transformers.js names the cache of ``config``'s model type (1: every layer)."""
    entry = STRIDED_CACHE_TYPES.get(config.get("model_type"))
    stride = config.get(entry) if entry is not None else None
    return stride if isinstance(stride, int) and stride > 1 else 1


def _dims(value: onnx.ValueInfoProto) -> list[Any]:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def _joinable(values: list[onnx.ValueInfoProto]) -> bool:
    """Whether ``values`` differ only in their static second dim."""
    shapes = [_dims(value) for value in values]
    types = {value.type.tensor_type.elem_type for value in values}
    return len(types) == 1 and all(len(s) > _AXIS and isinstance(s[_AXIS], int) and s[_AXIS] > 0 for s in shapes) and all(
        s[:_AXIS] + s[_AXIS + 1:] == shapes[0][:_AXIS] + shapes[0][_AXIS + 1:] for s in shapes)


def _groups(layers: int, stride: int) -> list[list[int]]:
    return [list(range(first, min(first + stride, layers))) for first in range(0, layers, stride)]


def join_strided_layers(graph: onnx.GraphProto, layers: int, stride: int) -> list[int]:
    """Feed ``graph``'s ``layers`` layers' caches in groups of ``stride`` (see the module's
    docstring); the first layers of the groups joined (none: ``graph`` unchanged, when any
    group cannot be joined)."""
    inputs = {value.name: value for value in graph.input}
    outputs = {value.name: value for value in graph.output}
    groups = [group for group in _groups(layers, stride) if len(group) > 1]
    for group, kind in [(group, kind) for group in groups for kind in _KINDS]:
        past = [inputs.get(f"past_key_values.{layer}.{kind}") for layer in group]
        present = [outputs.get(f"present.{layer}.{kind}") for layer in group]
        if None in past or None in present or not _joinable(past) or not _joinable(present):
            return []
    first: list[onnx.NodeProto] = []
    last: list[onnx.NodeProto] = []
    for group, kind in [(group, kind) for group in groups for kind in _KINDS]:
        past = [f"past_key_values.{layer}.{kind}" for layer in group]
        present = [f"present.{layer}.{kind}" for layer in group]
        widths = [_dims(inputs[name])[_AXIS] for name in past]
        for name in past:
            rename_value(graph, name, f"{name}/split")
        for name in present:
            rename_value(graph, name, f"{name}/joined")
        at = f"past_key_values.{group[0]}.{kind}.joined"
        first += [
            int64_constant(f"{at}/widths", widths),
            helper.make_node("Split", [past[0], f"{at}/widths"], [f"{name}/split" for name in past], name=f"{at}/split",
                             axis=_AXIS),
        ]
        last.append(helper.make_node("Concat", [f"{name}/joined" for name in present], [present[0]],
                                     name=f"present.{group[0]}.{kind}.joined/concat", axis=_AXIS))
        for values, names in ((graph.input, past), (graph.output, present)):
            kept = {value.name: value for value in values}
            joined = _dims(kept[names[0]])
            joined[_AXIS] = sum(widths)
            kept[names[0]].CopyFrom(helper.make_tensor_value_info(
                names[0], kept[names[0]].type.tensor_type.elem_type, joined))
            for name in names[1:]:
                values.remove(kept[name])
    kept_nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend([*first, *kept_nodes, *last])  # the split reads only inputs, the join the exported nodes' outputs
    return [group[0] for group in groups]


def write_strided_cache(folder: Path, relative: str, config: Mapping[str, Any]) -> bool:
    """Rewrite the graph at ``relative`` in ``folder`` to take its cache in the groups
    Transformers.js feeds the model type of ``config`` (a dict); False (nothing written) when
    it feeds every layer or the groups cannot be joined."""
    stride, layers = cache_stride(config), config.get("num_hidden_layers")
    if stride == 1 or not isinstance(layers, int):
        return False
    return rewrite_graph_file(folder / relative, lambda graph: join_strided_layers(graph, layers, stride))
