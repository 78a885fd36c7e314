"""A hybrid decoder's convolution and recurrent states under the names Transformers.js feeds
them.

The export names a hybrid layer's states after transformers' cache layer
(`past_key_values.<i>.conv_states.0`, `past_key_values.<i>.recurrent_states.0`, and their
`present.*` outputs; translate/io_names.py). Transformers.js names them by model type
(`getCacheNames` in its `dist/transformers.node.mjs`): `past_conv.<i>` with `past_ssm.<i>` or
`past_recurrent.<i>`, OLMo-hybrid's convolution of queries, keys and values as three inputs,
ZAYA's beside its keys and values (`past_key_values.<i>.conv_state`, `.shift_state`), and
reads each output `present*` back as the next step's `past*`. It feeds every cache input
zeros of the input's own shape on the first step (its dims other than `batch_size` static), as
the export's verification starts a state.

ONNX Runtime GenAI has no `genai_config.json` for a hybrid decoder (genai_config.py), so the
folder's one graph takes Transformers.js's names; onnxruntime users feed the names the graph
says. The graph file is rewritten without loading the weights: each renamed input or output is
tied to the exported graph's own value by an `Identity` (a `Concat` or `Split` where one state is
fed as several), so the nodes keep their names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from fx2onnx.hub.decoders.graph_files import int64_constant, rewrite_graph_file
from fx2onnx.hub.shared.dim_roles import present_name

_STATE = re.compile(r"past_key_values\.(\d+)\.(conv_states|recurrent_states)\.0")
# the channel dim of a convolution state (batch, channels, kernel)
_CHANNELS = 1


@dataclass(frozen=True)
class StateNames:
    """Transformers.js's input names for one model type's states of layer ``{layer}``: its
    convolution state's (several when the state is fed in parts along its channels, whose sizes
    ``conv_parts`` reads from the config) and its recurrent state's (None: the layer has none)."""

    conv: tuple[str, ...]
    recurrent: str | None = None
    conv_parts: Callable[[Mapping[str, Any]], list[int]] | None = None


def _queries_keys_values(config: Mapping[str, Any]) -> list[int]:
    """OLMo-hybrid's convolution channels: its queries', keys' and values' (transformers'
    `OlmoHybridGatedDeltaNet` convolves them concatenated in this order)."""
    keys = config["linear_num_key_heads"] * config["linear_key_head_dim"]
    return [keys, keys, config["linear_num_value_heads"] * config["linear_value_head_dim"]]


_CONV = ("past_conv.{layer}",)
_MAMBA = StateNames(_CONV, "past_ssm.{layer}")
_GATED_DELTA = StateNames(_CONV, "past_recurrent.{layer}")

# model type -> the names Transformers.js feeds its states by
TRANSFORMERS_JS_STATE_NAMES = {
    "lfm2": StateNames(_CONV),
    "lfm2_moe": StateNames(_CONV),
    "lfm3": StateNames(_CONV),
    "falcon_h1": _MAMBA,
    "nemotron_h": _MAMBA,
    "granitemoehybrid": _MAMBA,
    "qwen3_next": _GATED_DELTA,
    "qwen3_5_text": _GATED_DELTA,
    "qwen3_5_moe_text": _GATED_DELTA,
    # a ZAYA layer's convolution of queries and keys, and its previous token's delayed values
    "zaya": StateNames(("past_key_values.{layer}.conv_state",), "past_key_values.{layer}.shift_state"),
    "olmo_hybrid": StateNames(
        ("past_conv.{layer}.query", "past_conv.{layer}.key", "past_conv.{layer}.value"), "past_recurrent.{layer}",
        _queries_keys_values),
}


def state_names(config: Mapping[str, Any]) -> StateNames | None:
    """How Transformers.js names the states of the model of `config.json` ``config`` (a dict),
    None when it has no names of its own for them."""
    return TRANSFORMERS_JS_STATE_NAMES.get(config.get("model_type"))


def rename_states(graph: onnx.GraphProto, names: StateNames, config: Mapping[str, Any]) -> dict[str, list[str]]:
    """Give ``graph``'s state inputs and their `present.*` outputs the names ``names`` says, in
    place; returns each exported input's new names. A state fed in parts is joined along its
    channels before the graph reads it, and its next value split the same way."""
    inputs = {value.name: value for value in graph.input}
    outputs = {value.name: value for value in graph.output}
    renamed: dict[str, list[str]] = {}
    head, tail, new_inputs, new_outputs = [], [], {}, {}
    for name in inputs:
        match = _STATE.fullmatch(name)
        if match is None:
            continue
        layer, kind = match.groups()
        templates = names.conv if kind == "conv_states" else (names.recurrent,)
        if templates == (None,):
            raise ValueError(f"{name}: Transformers.js feeds model type {config.get('model_type')} no recurrent state")
        new = [template.format(layer=layer) for template in templates]
        present = present_name(name)
        if present not in outputs:
            raise ValueError(f"the graph has {name} but no {present} to give its next value")
        sizes = names.conv_parts(config) if len(new) > 1 and names.conv_parts is not None else None
        if len(new) > 1 and (sizes is None or len(sizes) != len(new)):
            raise ValueError(f"{name} is fed as {len(new)} inputs but their sizes are not known")
        channels = inputs[name].type.tensor_type.shape.dim[_CHANNELS].dim_value
        if sizes is not None and sum(sizes) != channels:
            raise ValueError(f"{name} has {channels} channels, not the {' + '.join(map(str, sizes))} its config gives "
                             f"the parts {', '.join(new)}")
        head.append(_joined(new, name, sizes))
        tail += _split(present, [present_name(part) for part in new], sizes)
        new_inputs[name] = [_resized(inputs[name], part, sizes, i) for i, part in enumerate(new)]
        new_outputs[present] = [_resized(outputs[present], present_name(part), sizes, i) for i, part in enumerate(new)]
        renamed[name] = new
    _replace(graph.input, new_inputs)
    _replace(graph.output, new_outputs)
    kept = list(graph.node)
    del graph.node[:]
    graph.node.extend([*head, *kept, *tail])
    return renamed


def _joined(parts: list[str], name: str, sizes: list[int] | None) -> onnx.NodeProto:
    if sizes is None:
        return onnx.helper.make_node("Identity", parts, [name], name=f"{parts[0]}.fed")
    return onnx.helper.make_node("Concat", parts, [name], axis=_CHANNELS, name=f"{name}.joined")


def _split(name: str, parts: list[str], sizes: list[int] | None) -> list[onnx.NodeProto]:
    if sizes is None:
        return [onnx.helper.make_node("Identity", [name], parts, name=f"{parts[0]}.given")]
    sizes_name = f"{name}.split_sizes"
    return [
        int64_constant(sizes_name, sizes),
        onnx.helper.make_node("Split", [name, sizes_name], parts, axis=_CHANNELS, name=f"{name}.split"),
    ]


def _resized(value: onnx.ValueInfoProto, name: str, sizes: list[int] | None, index: int) -> onnx.ValueInfoProto:
    """``value``'s type under ``name``: the ``index``-th part's channels when fed in parts."""
    part = onnx.ValueInfoProto()
    part.CopyFrom(value)
    part.name = name
    if sizes is not None:
        part.type.tensor_type.shape.dim[_CHANNELS].dim_value = sizes[index]
    return part


def _replace(values: Any, replacements: dict[str, list[onnx.ValueInfoProto]]) -> None:
    """Put each value's replacements where it was."""
    kept = [new for value in values for new in replacements.get(value.name, [value])]
    del values[:]
    values.extend(kept)


def write_transformers_js_states(folder: Path, relative: str, config: Mapping[str, Any]) -> bool:
    """Rename the states of the graph at ``relative`` in ``folder`` as Transformers.js feeds
    the model of ``config`` (a dict); False (nothing written) when it has no names of its own
or the graph no states."""
    names = state_names(config)
    if names is None:
        return False
    return rewrite_graph_file(folder / relative, lambda graph: rename_states(graph, names, config))

