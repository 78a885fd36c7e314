"""A text-generation folder for a config that says ``multi_query: true`` (Falcon's and
GPT-BigCode's defaults): two graph files over one weights file.

Transformers.js reads `config.json`'s ``multi_query`` whatever the model type and then
feeds one combined ``past_key_values.<i>.key_value`` input per layer (and reads
``present.<i>.key_value``); it loads `onnx/model.onnx` by that name. ONNX Runtime GenAI 0.18
feeds a decoder only separate ``past_key_values.<i>.key`` / ``.value`` inputs (it has no
combined cache for a decoder), and reads the file its `genai_config.json` names. So:

- `onnx/model.onnx` takes the combined cache: each layer's key and value side by side on
  the last dim (batch, heads, past length, 2 x head size), split into the key and value the
  exported graph reads, and its presents joined the same way;
- `onnx/model_separate_cache.onnx` (the same stem for other dtypes) is the graph as
  exported, which `genai_config.json` names.

Both graphs read their weights from the one data file beside them (`model.onnx_data`), so
nothing is stored twice. The graph files are rewritten without loading the weights.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx

from fx2onnx.hub.decoders.graph_files import int64_constant
from fx2onnx.hub.shared.folder_layout import client_graph_file

_PAST = re.compile(r"past_key_values\.(\d+)\.key")
SEPARATE_CACHE_ROLE = "separate_cache"


def reads_combined_cache(config: Mapping[str, Any]) -> bool:
    """Whether Transformers.js feeds the folder of `config.json` ``config`` (a dict) one
    combined cache input per layer: its ``multi_query`` is true, whatever the model type."""
    return bool(config.get("multi_query"))


def separate_cache_file(relative: str) -> str:
    """The folder path of the graph with a separate key and value per layer, beside the
    combined one at ``relative`` (`onnx/model.onnx` -> `onnx/model_separate_cache.onnx`)."""
    return client_graph_file(relative, SEPARATE_CACHE_ROLE)


def combine_cache(graph: onnx.GraphProto) -> None:
    """Replace each layer's ``past_key_values.<i>.key`` / ``.value`` inputs of ``graph`` by one
    ``past_key_values.<i>.key_value`` input (key and value side by side on the last dim), and its
    ``present.<i>.key`` / ``.value`` outputs by ``present.<i>.key_value``, in place. The graph's
    own nodes keep reading and writing the separate values, under the same names."""
    inputs = {value.name: value for value in graph.input}
    outputs = {value.name: value for value in graph.output}
    layers = sorted(int(match.group(1)) for name in inputs if (match := _PAST.fullmatch(name)))
    if not layers:
        raise ValueError("the graph has no past_key_values.<i>.key input to combine with its value")
    split_nodes, join_nodes, new_inputs, new_outputs = [], [], {}, {}
    for layer in layers:
        past_key, past_value = f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"
        present_key, present_value = f"present.{layer}.key", f"present.{layer}.value"
        missing = [] if past_value in inputs else [past_value]
        missing += [name for name in (present_key, present_value) if name not in outputs]
        if missing:
            raise ValueError(f"layer {layer} of the graph has no {', '.join(missing)}: its cache cannot be combined")
        head_size = _static_last_dim(inputs[past_key])
        sizes = f"cache_split_sizes.{layer}"
        split_nodes += [
            int64_constant(sizes, [head_size, head_size]),
            onnx.helper.make_node("Split", [f"past_key_values.{layer}.key_value", sizes], [past_key, past_value], axis=-1,
                                  name=f"past_key_values.{layer}.split"),
        ]
        join_nodes.append(onnx.helper.make_node("Concat", [present_key, present_value], [f"present.{layer}.key_value"],
                                                axis=-1, name=f"present.{layer}.join"))
        new_inputs[past_key] = _side_by_side(inputs[past_key], f"past_key_values.{layer}.key_value")
        new_outputs[present_key] = _side_by_side(outputs[present_key], f"present.{layer}.key_value")
    _replace_values(graph.input, new_inputs, {f"past_key_values.{layer}.value" for layer in layers})
    _replace_values(graph.output, new_outputs, {f"present.{layer}.value" for layer in layers})
    kept = list(graph.node)
    del graph.node[:]
    graph.node.extend([*split_nodes, *kept, *join_nodes])


def _static_last_dim(value: onnx.ValueInfoProto) -> int:
    dims = value.type.tensor_type.shape.dim
    if not dims or not dims[-1].HasField("dim_value"):
        raise ValueError(f"{value.name} has no static head size: its key and value cannot be combined on the last dim")
    return int(dims[-1].dim_value)


def _side_by_side(value: onnx.ValueInfoProto, name: str) -> onnx.ValueInfoProto:
    """The value info of ``value``'s key and value side by side on the last dim, named ``name``."""
    combined = onnx.ValueInfoProto()
    combined.CopyFrom(value)
    combined.name = name
    last = combined.type.tensor_type.shape.dim[-1]
    last.dim_value = 2 * last.dim_value
    return combined


def _replace_values(values: Any, replacements: dict[str, onnx.ValueInfoProto], dropped: set[str]) -> None:
    """Put each replacement where the value of its key was, and drop the ``dropped`` ones."""
    kept = [replacements.get(value.name, value) for value in values if value.name not in dropped]
    del values[:]
    values.extend(kept)


def write_combined_cache_graph(folder: Path, relative: str) -> str:
    """Move the graph at ``relative`` in ``folder`` (separate key and value inputs) to its
    separate-cache name and write the combined-cache graph at ``relative``, both over the
    same weights file; returns the separate-cache graph's folder path."""
    path = folder / relative
    separate = separate_cache_file(relative)
    graph = onnx.load(str(path), load_external_data=False)
    onnx.save(graph, str(folder / separate))
    combine_cache(graph.graph)
    onnx.save(graph, str(path))
    return separate
