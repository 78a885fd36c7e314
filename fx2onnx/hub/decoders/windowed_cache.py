"""ONNX Runtime GenAI's window-sized cache for a sliding-window decoder's sliding layers.

The folder's `onnx/model.onnx` keeps every token in every layer and counts its slots in
`attention_mask` columns: Transformers.js and onnxruntime read it too, so its contract
stays. ONNX Runtime GenAI gets a decoder of its own, `onnx/model_windowed_cache.onnx`
beside it (`windowed_decoder_file`: the same weights, the same data file), written from
the saved model:

- every layer's `GroupQueryAttention` counts its slots in held tokens: each row's
  `seqlens_k` is its own count of held tokens minus one and `query_seqlens` its count
  of held new tokens, so padding never enters the cache, and the kernel runs without
  the mask's bias (right-padded new tokens are what `query_seqlens` describes);
- a sliding layer's kernel reads a window-sized buffer (`sliding_window_cache`): rows
  [0, L) hold the row's last L held tokens, L = T if T <= C, else T - G * ceil((T - C) /
  G), G = C - W + 1, for T held tokens, a buffer of C slots and a window of W
  (onnxruntime's contract); `genai_config.json`'s `sliding_window` section makes the
  runtime give those layers a buffer of the window plus its slack.

The kernel takes a step where it is exact: each row's new tokens are held ones then
padding, every row holds a token, the positions are the held tokens' counts, and the
layer's buffer is long enough (a sliding layer's at least the window, or else the past
and the new tokens of every row: then nothing is evicted and the kernel runs without the
windowed cache; a full layer's the past and the new tokens). Otherwise (a left-padded
batch, a row with a gap among its new tokens, a buffer too short for the step) the layer
computes the same attention in standard operators and writes the buffer in the layout
the kernel would have left, so that the next steps run the kernel. Nothing is written
where the window reaches the context length (nothing would be evicted).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir import convenience

from fx2onnx.hub.shared.folder_layout import client_graph_file
from fx2onnx.onnx_passes import AppendedNodes

WINDOWED_CACHE_ROLE = "windowed_cache"
_KERNEL = ("com.microsoft", "GroupQueryAttention")
_SINKS, _QUERY_SEQLENS = 11, 16  # the kernel's head_sink and query_seqlens inputs
# the kernel attributes the exact form computes (others, such as a soft cap, leave the folder as it is)
_COMPUTED = {"num_heads", "kv_num_heads", "scale", "local_window_size", "do_rotary", "rotary_interleaved"}
_INT64, _INT32, _BOOL = ir.DataType.INT64, ir.DataType.INT32, ir.DataType.BOOL


def _item(nodes: AppendedNodes, shape_of: ir.Value, index: int) -> ir.Value:
    """A dim of ``shape_of`` as a scalar."""
    return nodes("Gather", [nodes("Shape", [shape_of]), nodes.constant(index)], axis=0)


def _unsqueeze(nodes: AppendedNodes, value: ir.Value, *axes: int) -> ir.Value:
    return nodes("Unsqueeze", [value, nodes.constant(list(axes))])


@dataclass
class _Rows:
    """What every layer reads of the mask, per row: held tokens before the step (B),
    held new tokens (B), held tokens after it (B), which new tokens are held (B, S),
    each new token's position (B, S), the j-th held new token's index (B, S), the new
    tokens' count (scalar), the largest count after the step (scalar), and the
    kernel's inputs (int32 `seqlens_k`, `total_sequence_length`, `query_seqlens`)."""

    past: ir.Value
    new_held: ir.Value
    after: ir.Value
    held: ir.Value
    positions: ir.Value
    held_index: ir.Value
    new: ir.Value
    most: ir.Value
    seqlens: ir.Value
    total: ir.Value
    query_seqlens: ir.Value
    right_padded: ir.Value  # every row's new tokens are held ones then padding, and every row holds one


def _rows(nodes: AppendedNodes, mask: ir.Value, ids: ir.Value, position_ids: ir.Value) -> _Rows:
    """:class:`_Rows` from the graph's inputs (the new tokens' count from ``ids``); the
    kernel's condition checks that each held new token's position is the row's count of
    held tokens before it, which the kernel's own rotation assumes."""
    mask = nodes("Cast", [mask], to=_INT64)
    total, new = _item(nodes, mask, 1), _item(nodes, ids, 1)
    split, axis = _unsqueeze(nodes, nodes("Sub", [total, new]), 0), nodes.constant([1])
    held = nodes("Slice", [mask, split, _unsqueeze(nodes, total, 0), axis])
    past = nodes("ReduceSum", [nodes("Slice", [mask, nodes.constant([0]), split, axis]), axis], keepdims=0)
    new_held = nodes("ReduceSum", [held, axis], keepdims=0)
    after = nodes("Add", [past, new_held])
    counts = nodes("CumSum", [held, nodes.constant(1)])
    one = nodes.constant(1)
    positions = nodes("Sub", [nodes("Add", [_unsqueeze(nodes, past, 1), counts]), one])
    is_held = nodes("Cast", [held], to=_BOOL)
    steps = nodes("Range", [nodes.constant(0), new, one])
    leading = nodes("Less", [_unsqueeze(nodes, steps, 0), _unsqueeze(nodes, new_held, 1)])
    ordered = nodes("Equal", [nodes("Cast", [leading], to=_INT64), held])
    given = nodes("Cast", [position_ids], to=_INT64)
    placed = nodes("Or", [nodes("Not", [is_held]), nodes("Equal", [given, positions])])
    fine = nodes("And", [ordered, placed])
    right_padded = nodes("And", [
        nodes("Equal", [nodes("ReduceMin", [nodes("Cast", [fine], to=_INT64)], keepdims=0), one]),
        nodes("GreaterOrEqual", [nodes("ReduceMin", [after], keepdims=0), one]),
    ])
    # the j-th held new token's index among the new tokens (0 where a row holds fewer)
    wanted = nodes("Reshape", [nodes("Add", [steps, one]), nodes.constant([1, -1, 1])])
    match = nodes("And", [nodes("Equal", [_unsqueeze(nodes, counts, 1), wanted]), _unsqueeze(nodes, is_held, 1)])
    held_index = nodes("ArgMax", [nodes("Cast", [match], to=_INT32)], axis=2, keepdims=0)
    most = nodes("ReduceMax", [after], keepdims=0)
    return _Rows(
        past=past, new_held=new_held, after=after, held=is_held, positions=positions, held_index=held_index, new=new,
        most=most, seqlens=nodes("Cast", [nodes("Sub", [after, one])], to=_INT32),
        total=nodes("Cast", [nodes("Max", [most, new])], to=_INT32),
        query_seqlens=nodes("Cast", [new_held], to=_INT32), right_padded=right_padded,
    )


def _resident(nodes: AppendedNodes, tokens: ir.Value, capacity: ir.Value, window: int) -> ir.Value:
    """onnxruntime's L(T): how many of a row's last ``tokens`` a windowed buffer of
    ``capacity`` slots holds."""
    one = nodes.constant(1)
    reclaimed = nodes("Max", [nodes("Add", [nodes("Sub", [capacity, nodes.constant(window)]), one]), one])
    over = nodes("Sub", [tokens, capacity])
    evictions = nodes("Div", [nodes("Add", [over, nodes("Sub", [reclaimed, one])]), reclaimed])
    return nodes("Where", [nodes("LessOrEqual", [tokens, capacity]), tokens,
                           nodes("Sub", [tokens, nodes("Mul", [reclaimed, evictions])])])


@dataclass
class _Layer:
    kernel: ir.Node  # the folder's kernel without the bias, rotating its query and key itself
    query: ir.Value  # the query and key after their rotations (computed by ``rotations``)
    key: ir.Value
    value: ir.Value  # apart, as the kernel with the bias reads it (the folder's kernel may read the three packed)
    rotations: list[ir.Node]
    window: int
    outputs: list[ir.Value]


def _heads(nodes: AppendedNodes, packed: ir.Value, heads: int) -> ir.Value:
    """(B, S, heads * D) as (B, heads, S, D)."""
    return nodes("Transpose", [nodes("Reshape", [packed, nodes.constant([0, 0, heads, -1])])], perm=[0, 2, 1, 3])


def _attribute(node: ir.Node, name: str, default: Any) -> Any:
    found = node.attributes.get(name)
    return default if found is None else found.value


def _exact(nodes: AppendedNodes, layer: _Layer, rows: _Rows, dtype: ir.DataType) -> list[ir.Value]:
    """The layer's output and buffers in standard operators, the buffers in the kernel's
    layout (held tokens only; a sliding layer's last L(T) of them)."""
    kernel = layer.kernel
    heads, kv_heads = _attribute(kernel, "num_heads", 0), _attribute(kernel, "kv_num_heads", 0)
    value, past_key, past_value = layer.value, kernel.inputs[3], kernel.inputs[4]
    sinks = kernel.inputs[_SINKS] if len(kernel.inputs) > _SINKS else None
    capacity, window = _item(nodes, past_key, 2), layer.window
    numpy_type = dtype.numpy()
    resident = _resident(nodes, rows.past, capacity, window) if window > 0 else rows.past
    first = nodes("Sub", [rows.past, resident])  # the position of the buffer's row 0
    one, zero = nodes.constant(1), nodes.constant(0)
    slots = nodes("Range", [zero, capacity, one])
    key_positions = nodes("Concat", [nodes("Add", [_unsqueeze(nodes, first, 1), _unsqueeze(nodes, slots, 0)]),
                                     rows.positions], axis=1)
    key_held = nodes("Concat", [nodes("Less", [_unsqueeze(nodes, slots, 0), _unsqueeze(nodes, resident, 1)]), rows.held],
                     axis=1)
    queries, keys_at = _unsqueeze(nodes, rows.positions, 2), _unsqueeze(nodes, key_positions, 1)
    visible = nodes("And", [_unsqueeze(nodes, key_held, 1), nodes("LessOrEqual", [keys_at, queries])])
    if window > 0:
        visible = nodes("And", [visible, nodes("Less", [nodes("Sub", [queries, keys_at]), nodes.constant(window)])])
    # a padding token sees itself only (its result is read by no held token)
    every_slot = nodes("Range", [zero, nodes("Add", [capacity, rows.new]), one])
    own = nodes("Equal", [_unsqueeze(nodes, every_slot, 0, 1),
                          _unsqueeze(nodes, nodes("Add", [capacity, nodes("Range", [zero, rows.new, one])]), 0, 2)])
    visible = nodes("Or", [visible, nodes("And", [nodes("Not", [_unsqueeze(nodes, rows.held, 2)]), own])])
    lowest = nodes.constant(np.finfo(numpy_type).min, numpy_type)
    bias = nodes("Where", [_unsqueeze(nodes, visible, 1), nodes.constant(0, numpy_type), lowest])  # (B, 1, S, C + S)
    # the slots of no held token zeroed: a buffer's rows past its resident ones are unspecified, and so are
    # a padding token's key and value after a layer that ran the kernel (a weight of 0 times NaN is NaN)
    kept_slots = _unsqueeze(nodes, key_held, 1, 3)
    keys, values = (nodes("Where", [kept_slots, nodes("Concat", [past, _heads(nodes, fresh, kv_heads)], axis=2),
                                    nodes.constant(0, numpy_type)])
                    for past, fresh in ((past_key, layer.key), (past_value, value)))
    attended_keys, attended_values = keys, values
    if sinks is not None:  # each head's sink: one more key, of zeros, whose score is the sink and whose value is zeros
        shape = nodes("Shape", [keys])
        column = nodes("Concat", [nodes("Slice", [shape, nodes.constant([0]), nodes.constant([2])]), nodes.constant([1]),
                                  nodes("Slice", [shape, nodes.constant([3]), nodes.constant([4])])], axis=0)
        zeros = nodes("ConstantOfShape", [column], value=ir.tensor(np.zeros(1, numpy_type)))
        attended_keys, attended_values = (nodes("Concat", [x, zeros], axis=2) for x in (keys, values))
        bias_shape = nodes("Shape", [bias])
        batch_queries = [nodes("Slice", [bias_shape, nodes.constant([s]), nodes.constant([s + 1])]) for s in (0, 2)]
        per_head = nodes("Concat", [batch_queries[0], nodes.constant([heads]), batch_queries[1]], axis=0)
        bias = nodes("Concat", [
            nodes("Expand", [bias, nodes("Concat", [per_head, nodes("Slice", [bias_shape, nodes.constant([3]),
                                                                              nodes.constant([4])])], axis=0)]),
            nodes("Expand", [nodes("Reshape", [sinks, nodes.constant([1, heads, 1, 1])]),
                             nodes("Concat", [per_head, nodes.constant([1])], axis=0)]),
        ], axis=3)
    scale = _attribute(kernel, "scale", 0.0)
    attended = nodes("Attention", [_heads(nodes, layer.query, heads), attended_keys, attended_values, bias],
                     **({"scale": scale} if scale else {}))
    output = nodes("Reshape", [nodes("Transpose", [attended], perm=[0, 2, 1, 3]), nodes.constant([0, 0, -1])])
    # the buffers after the step: row i holds the row's held token T - L + i
    if window > 0:
        kept = nodes("Max", [capacity, nodes("Min", [nodes.constant(window), rows.most])])
        remaining = _resident(nodes, rows.after, kept, window)
    else:
        kept, remaining = nodes("Max", [capacity, rows.most]), rows.after
    rows_out = _unsqueeze(nodes, nodes("Range", [zero, kept, one]), 0)
    token = nodes("Add", [_unsqueeze(nodes, nodes("Sub", [rows.after, remaining]), 1), rows_out])
    before = _unsqueeze(nodes, rows.past, 1)
    last_new = nodes("Sub", [rows.new, one])
    nth_new = nodes("Min", [nodes("Max", [nodes("Sub", [token, before]), zero]), last_new])
    from_new = nodes("Add", [capacity, nodes("GatherElements", [rows.held_index, nth_new], axis=1)])
    slot = nodes("Where", [nodes("Less", [token, before]), nodes("Sub", [token, _unsqueeze(nodes, first, 1)]), from_new])
    slot = nodes("Where", [nodes("Less", [rows_out, _unsqueeze(nodes, remaining, 1)]), slot, zero])  # the rest: any row
    slot = nodes("Min", [nodes("Max", [slot, zero]), nodes("Sub", [nodes("Add", [capacity, rows.new]), one])])
    # the index's shape: (B, kv heads, kept, D)
    shape = nodes("Shape", [past_key])
    target = nodes("Concat", [nodes("Slice", [shape, nodes.constant([0]), nodes.constant([2])]), _unsqueeze(nodes, kept, 0),
                              nodes("Slice", [shape, nodes.constant([3]), nodes.constant([4])])], axis=0)
    index = nodes("Expand", [_unsqueeze(nodes, slot, 1, 3), target])
    presents = [nodes("GatherElements", [cache, index], axis=2) for cache in (keys, values)]
    return [output, *presents]


def _layers(graph: ir.Graph) -> dict[int, _Layer]:
    """By node index, the layers whose guard this rewrites: an `If` whose first branch is
    the kernel alone (without the bias) and whose second computes the rotations then
    chooses between the kernel with the bias and the exact form."""
    found = {}
    for index, node in enumerate(graph):
        if node.op_type != "If":
            continue
        fast, padded = (_branch(node, name) for name in ("then_branch", "else_branch"))
        if fast is None or padded is None or len(fast) != 1 or (fast[0].domain, fast[0].op_type) != _KERNEL:
            continue
        if not len(padded) or padded[-1].op_type != "If":
            continue
        inner = _branch(padded[-1], "then_branch")
        with_bias = next((n for n in inner if (n.domain, n.op_type) == _KERNEL), None)
        kernel = fast[0]
        if with_bias is None or set(kernel.attributes) - _COMPUTED:
            continue
        found[index] = _Layer(kernel=kernel, query=with_bias.inputs[0], key=with_bias.inputs[1], value=with_bias.inputs[2],
                              rotations=list(padded)[:-1], window=_attribute(kernel, "local_window_size", -1),
                              outputs=list(fast.outputs))
    return found


def _branch(node: ir.Node, name: str) -> ir.Graph | None:
    attribute = node.attributes.get(name)
    return None if attribute is None else attribute.as_graph()


def _kernel_graph(layer: _Layer, rows: _Rows, name: str, windowed: bool) -> ir.Graph:
    """The layer's kernel counting its slots in held tokens, on a window-sized buffer
    (`sliding_window_cache`) when ``windowed``."""
    inputs = list(layer.kernel.inputs) + [None] * (_QUERY_SEQLENS + 1 - len(layer.kernel.inputs))
    inputs[5], inputs[6], inputs[10], inputs[_QUERY_SEQLENS] = rows.seqlens, rows.total, None, rows.query_seqlens
    attributes = {attribute.name: attribute.value for attribute in layer.kernel.attributes.values()}
    suffix = "windowed_kernel" if windowed else "held_kernel"
    if windowed:
        attributes["sliding_window_cache"] = 1
    node = ir.node("GroupQueryAttention", inputs, attributes, domain=_KERNEL[0], num_outputs=3, name=f"{name}/{suffix}")
    outputs = _typed(node.outputs, [f"{name}/{suffix}_{i}" for i in range(3)], layer.outputs)
    return ir.Graph([], outputs, nodes=[node], name=f"{name}_{suffix}")


def _kernel_branch(layer: _Layer, rows: _Rows, name: str, holds_window: ir.Value | None) -> ir.Graph:
    """The kernel a layer runs: a sliding layer's on its window-sized buffer where the
    buffer holds the window (``holds_window``), else (a buffer shorter than the window:
    nothing is evicted while the sequence fits it) without `sliding_window_cache`."""
    if layer.window <= 0:
        return _kernel_graph(layer, rows, name, windowed=False)
    choice = ir.node("If", [holds_window], {"then_branch": _kernel_graph(layer, rows, name, windowed=True),
                                            "else_branch": _kernel_graph(layer, rows, name, windowed=False)},
                     num_outputs=3, name=f"{name}/window_or_not")
    outputs = _typed(choice.outputs, [f"{name}/window_or_not_{i}" for i in range(3)], layer.outputs)
    return ir.Graph([], outputs, nodes=[choice], name=f"{name}_kernel")


def _typed(values: Sequence[ir.Value], names: list[str], like: list[ir.Value]) -> list[ir.Value]:
    """``values`` named ``names``, of ``like``'s element types and no shape."""
    for value, name, model_value in zip(values, names, like):
        value.name, value.type, value.shape = name, ir.TensorType(model_value.dtype), None
    return list(values)


def _exact_branch(layer: _Layer, rows: _Rows, name: str) -> ir.Graph:
    nodes = AppendedNodes(f"{name}/held_exact")
    results = _exact(nodes, layer, rows, layer.outputs[0].dtype)
    results = _typed(results, [result.name for result in results], layer.outputs)
    for rotation in layer.rotations:  # moved from the folder's branch into this one
        rotation.graph.remove(rotation)
    return ir.Graph([], results, nodes=[*layer.rotations, *nodes.nodes], name=f"{name}_held_exact")


def _buffer_fits(nodes: AppendedNodes, layer: _Layer, rows: _Rows) -> tuple[ir.Value, ir.Value | None]:
    """Whether the kernel takes the layer's buffer (it holds the window, or the past and
    the new tokens of every row), and for a sliding layer whether it holds the window."""
    capacity = _item(nodes, layer.kernel.inputs[3], 2)
    room = nodes("GreaterOrEqual", [capacity, nodes("Add", [nodes("ReduceMax", [rows.past], keepdims=0), rows.new])])
    if layer.window <= 0:
        return room, None
    holds_window = nodes("GreaterOrEqual", [capacity, nodes.constant(layer.window)])
    return nodes("Or", [holds_window, room]), holds_window


def windowed_model(model: onnx.ModelProto, names: dict[str, str]) -> tuple[onnx.ModelProto, list[int], int] | None:
    """``model`` (a folder's decoder, its weights left where they are) with every guarded
    kernel counting held tokens and its sliding layers on a window-sized buffer; the
    sliding layers' indices and the window. None when it has no sliding kernel to
    rewrite (then ONNX Runtime GenAI reads the folder's decoder as it is)."""
    derived = ir.serde.deserialize_model(model)
    graph = derived.graph
    layers = _layers(graph)
    windows = {layer.window for layer in layers.values() if layer.window > 0}
    inputs = {value.name: value for value in graph.inputs}
    needed = (names.get("attention_mask"), names.get("position_ids"), names.get("input_ids"))
    if not windows or len(windows) > 1 or not all(name in inputs for name in needed):
        return None
    shared = AppendedNodes("held_tokens")  # they read only the graph's inputs: they go first
    rows = _rows(shared, inputs[needed[0]], inputs[needed[2]], inputs[needed[1]])
    guarded = list(graph)
    for index, layer in layers.items():
        node = guarded[index]
        fits, holds_window = _buffer_fits(shared, layer, rows)
        condition = shared("And", [rows.right_padded, fits])
        name = node.name or f"windowed_cache_{index}"
        choice = ir.node("If", [condition], {"then_branch": _kernel_branch(layer, rows, name, holds_window),
                                             "else_branch": _exact_branch(layer, rows, name)},
                         num_outputs=len(node.outputs), name=f"{name}/held_kernel_or_exact")
        convenience.replace_nodes_and_values(graph, node, [node], [choice], list(node.outputs), list(choice.outputs))
    graph.insert_before(graph[0], shared.nodes)
    sliding = _name_window_dims(graph, layers)
    return ir.serde.serialize_model(derived), sliding, windows.pop()


def _name_window_dims(graph: ir.Graph, layers: dict[int, _Layer]) -> list[int]:
    """The sliding layers' indices; their cache inputs and outputs get a dim name of their
    own (their length is the buffer's, not the sequence's)."""
    sliding_inputs = {layer.kernel.inputs[i].name for layer in layers.values() if layer.window > 0 for i in (3, 4)}
    indices = []
    for value in graph.inputs:
        if value.name in sliding_inputs:
            value.shape = _with_window_dim(value.shape)
            parts = value.name.split(".")
            if len(parts) > 1 and parts[1].isdigit() and value.name.endswith(".key"):
                indices.append(int(parts[1]))
    outputs = {f"present.{i}.{kind}" for i in indices for kind in ("key", "value")}
    for value in graph.outputs:
        if value.name in outputs:
            value.shape = _with_window_dim(value.shape)
    return sorted(indices)


def _with_window_dim(shape: ir.Shape) -> ir.Shape:
    dims = list(shape)
    dims[2] = ir.SymbolicDim("window_cache_length")
    return ir.Shape(dims)


def write_windowed_decoder(staging: Path, filename: str, genai: dict[str, Any]) -> dict[str, Any] | None:
    """Write ONNX Runtime GenAI's decoder beside the folder's ``filename`` (its weights
    read from the same data file) and return ``genai``'s config reading it, with its
    `sliding_window` section; None (nothing written) when the decoder has no sliding
    kernel to rewrite."""
    decoder = genai["model"]["decoder"]
    model = onnx.load(os.fspath(staging / filename), load_external_data=False)
    made = windowed_model(model, decoder["inputs"])
    if made is None:
        return None
    derived, layers, window = made
    if window >= genai["model"]["context_length"]:  # nothing is ever evicted: the folder's decoder serves
        return None
    relative = windowed_decoder_file(filename)
    onnx.save(derived, os.fspath(staging / relative))
    sliding = {"window_size": window, "slide_key_value_cache": False, "slide_inputs": False, "layers": layers,
               "cache_slack": 0}  # 0: the runtime's default slack (16 slots on CPU)
    return {**genai, "model": {**genai["model"], "decoder": {**decoder, "filename": relative,
                                                             "sliding_window": sliding}}}


def windowed_decoder_file(relative: str) -> str:
    """The folder path of GenAI's windowed decoder written from the graph at ``relative``."""
    return client_graph_file(relative, WINDOWED_CACHE_ROLE)
