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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fx2onnx.hub.shared.folder_layout import client_graph_file

WINDOWED_CACHE_ROLE = "windowed_cache"
_KERNEL = ("com.microsoft", "GroupQueryAttention")
_SINKS, _QUERY_SEQLENS = 11, 16  # the kernel's head_sink and query_seqlens inputs
# the kernel attributes the exact form computes (others, such as a soft cap, leave the folder as it is)
_COMPUTED = {"num_heads", "kv_num_heads", "scale", "local_window_size", "do_rotary", "rotary_interleaved"}
_INT64, _INT32, _BOOL = TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL


class _Nodes:
    """Nodes appended to a list, each made with one call, named under ``prefix``."""

    def __init__(self, prefix: str) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.prefix = prefix

    def __call__(self, op_type: str, inputs: list[str], domain: str = "", **attributes: Any) -> str:
        name = f"{self.prefix}/{op_type}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, domain=domain, **attributes))
        return name

    def const(self, value: Any, dtype: type = np.int64) -> str:
        return self("Constant", [], value=numpy_helper.from_array(np.asarray(value, dtype=dtype)))

    def item(self, shape_of: str, index: int) -> str:
        """A dim of ``shape_of`` as a scalar."""
        return self("Gather", [self("Shape", [shape_of]), self.const(index)], axis=0)

    def unsqueeze(self, value: str, *axes: int) -> str:
        return self("Unsqueeze", [value, self.const(list(axes))])


@dataclass
class _Rows:
    """What every layer reads of the mask, per row: held tokens before the step (B),
    held new tokens (B), held tokens after it (B), which new tokens are held (B, S),
    each new token's position (B, S), the j-th held new token's index (B, S), the new
    tokens' count (scalar), the largest count after the step (scalar), and the
    kernel's inputs (int32 `seqlens_k`, `total_sequence_length`, `query_seqlens`)."""

    past: str
    new_held: str
    after: str
    held: str
    positions: str
    held_index: str
    new: str
    most: str
    seqlens: str
    total: str
    query_seqlens: str
    right_padded: str  # every row's new tokens are held ones then padding, and every row holds one


def _rows(nodes: _Nodes, mask: str, ids: str, position_ids: str) -> _Rows:
    """:class:`_Rows` from the graph's inputs (the new tokens' count from ``ids``); the
    kernel's condition checks that each held new token's position is the row's count of
    held tokens before it, which the kernel's own rotation assumes."""
    mask = nodes("Cast", [mask], to=_INT64)
    total, new = nodes.item(mask, 1), nodes.item(ids, 1)
    split, axis = nodes.unsqueeze(nodes("Sub", [total, new]), 0), nodes.const([1])
    held = nodes("Slice", [mask, split, nodes.unsqueeze(total, 0), axis])
    past = nodes("ReduceSum", [nodes("Slice", [mask, nodes.const([0]), split, axis]), axis], keepdims=0)
    new_held = nodes("ReduceSum", [held, axis], keepdims=0)
    after = nodes("Add", [past, new_held])
    counts = nodes("CumSum", [held, nodes.const(1)])
    one = nodes.const(1)
    positions = nodes("Sub", [nodes("Add", [nodes.unsqueeze(past, 1), counts]), one])
    is_held = nodes("Cast", [held], to=_BOOL)
    steps = nodes("Range", [nodes.const(0), new, one])
    leading = nodes("Less", [nodes.unsqueeze(steps, 0), nodes.unsqueeze(new_held, 1)])
    ordered = nodes("Equal", [nodes("Cast", [leading], to=_INT64), held])
    given = nodes("Cast", [position_ids], to=_INT64)
    placed = nodes("Or", [nodes("Not", [is_held]), nodes("Equal", [given, positions])])
    fine = nodes("And", [ordered, placed])
    right_padded = nodes("And", [
        nodes("Equal", [nodes("ReduceMin", [nodes("Cast", [fine], to=_INT64)], keepdims=0), one]),
        nodes("GreaterOrEqual", [nodes("ReduceMin", [after], keepdims=0), one]),
    ])
    # the j-th held new token's index among the new tokens (0 where a row holds fewer)
    wanted = nodes("Reshape", [nodes("Add", [steps, one]), nodes.const([1, -1, 1])])
    match = nodes("And", [nodes("Equal", [nodes.unsqueeze(counts, 1), wanted]), nodes.unsqueeze(is_held, 1)])
    held_index = nodes("ArgMax", [nodes("Cast", [match], to=_INT32)], axis=2, keepdims=0)
    most = nodes("ReduceMax", [after], keepdims=0)
    return _Rows(
        past=past, new_held=new_held, after=after, held=is_held, positions=positions, held_index=held_index, new=new,
        most=most, seqlens=nodes("Cast", [nodes("Sub", [after, one])], to=_INT32),
        total=nodes("Cast", [nodes("Max", [most, new])], to=_INT32),
        query_seqlens=nodes("Cast", [new_held], to=_INT32), right_padded=right_padded,
    )


def _resident(nodes: _Nodes, tokens: str, capacity: str, window: int) -> str:
    """onnxruntime's L(T): how many of a row's last ``tokens`` a windowed buffer of
    ``capacity`` slots holds."""
    one = nodes.const(1)
    reclaimed = nodes("Max", [nodes("Add", [nodes("Sub", [capacity, nodes.const(window)]), one]), one])
    over = nodes("Sub", [tokens, capacity])
    evictions = nodes("Div", [nodes("Add", [over, nodes("Sub", [reclaimed, one])]), reclaimed])
    return nodes("Where", [nodes("LessOrEqual", [tokens, capacity]), tokens,
                           nodes("Sub", [tokens, nodes("Mul", [reclaimed, evictions])])])


@dataclass
class _Layer:
    kernel: onnx.NodeProto  # the folder's kernel without the bias, rotating its query and key itself
    query: str  # the query and key after their rotations (computed by ``rotations``)
    key: str
    rotations: list[onnx.NodeProto]
    window: int
    outputs: list[onnx.ValueInfoProto]


def _heads(nodes: _Nodes, packed: str, heads: int) -> str:
    """(B, S, heads * D) as (B, heads, S, D)."""
    return nodes("Transpose", [nodes("Reshape", [packed, nodes.const([0, 0, heads, -1])])], perm=[0, 2, 1, 3])


def _attribute(node: onnx.NodeProto, name: str, default: Any) -> Any:
    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else helper.get_attribute_value(found)


def _exact(nodes: _Nodes, layer: _Layer, rows: _Rows, dtype: int) -> list[str]:
    """The layer's output and buffers in standard operators, the buffers in the kernel's
    layout (held tokens only; a sliding layer's last L(T) of them)."""
    kernel = layer.kernel
    heads, kv_heads = _attribute(kernel, "num_heads", 0), _attribute(kernel, "kv_num_heads", 0)
    value, past_key, past_value = kernel.input[2], kernel.input[3], kernel.input[4]
    sinks = kernel.input[_SINKS] if len(kernel.input) > _SINKS and kernel.input[_SINKS] else None
    capacity, window = nodes.item(past_key, 2), layer.window
    numpy_type = helper.tensor_dtype_to_np_dtype(dtype)
    resident = _resident(nodes, rows.past, capacity, window) if window > 0 else rows.past
    first = nodes("Sub", [rows.past, resident])  # the position of the buffer's row 0
    one, zero = nodes.const(1), nodes.const(0)
    slots = nodes("Range", [zero, capacity, one])
    key_positions = nodes("Concat", [nodes("Add", [nodes.unsqueeze(first, 1), nodes.unsqueeze(slots, 0)]), rows.positions],
                          axis=1)
    key_held = nodes("Concat", [nodes("Less", [nodes.unsqueeze(slots, 0), nodes.unsqueeze(resident, 1)]), rows.held], axis=1)
    queries, keys_at = nodes.unsqueeze(rows.positions, 2), nodes.unsqueeze(key_positions, 1)
    visible = nodes("And", [nodes.unsqueeze(key_held, 1), nodes("LessOrEqual", [keys_at, queries])])
    if window > 0:
        visible = nodes("And", [visible, nodes("Less", [nodes("Sub", [queries, keys_at]), nodes.const(window)])])
    # a padding token sees itself only (its result is read by no held token)
    every_slot = nodes("Range", [zero, nodes("Add", [capacity, rows.new]), one])
    own = nodes("Equal", [nodes.unsqueeze(every_slot, 0, 1),
                          nodes.unsqueeze(nodes("Add", [capacity, nodes("Range", [zero, rows.new, one])]), 0, 2)])
    visible = nodes("Or", [visible, nodes("And", [nodes("Not", [nodes.unsqueeze(rows.held, 2)]), own])])
    lowest = nodes.const(np.finfo(numpy_type).min, numpy_type)
    bias = nodes("Where", [nodes.unsqueeze(visible, 1), nodes.const(0, numpy_type), lowest])  # (B, 1, S, C + S)
    # the slots of no held token zeroed: a buffer's rows past its resident ones are unspecified, and so are
    # a padding token's key and value after a layer that ran the kernel (a weight of 0 times NaN is NaN)
    kept_slots = nodes.unsqueeze(key_held, 1, 3)
    keys, values = (nodes("Where", [kept_slots, nodes("Concat", [past, _heads(nodes, fresh, kv_heads)], axis=2),
                                    nodes.const(0, numpy_type)])
                    for past, fresh in ((past_key, layer.key), (past_value, value)))
    attended_keys, attended_values = keys, values
    if sinks is not None:  # each head's sink: one more key, of zeros, whose score is the sink and whose value is zeros
        shape = nodes("Shape", [keys])
        column = nodes("Concat", [nodes("Slice", [shape, nodes.const([0]), nodes.const([2])]), nodes.const([1]),
                                  nodes("Slice", [shape, nodes.const([3]), nodes.const([4])])], axis=0)
        zeros = nodes("ConstantOfShape", [column], value=numpy_helper.from_array(np.zeros(1, numpy_type)))
        attended_keys, attended_values = (nodes("Concat", [x, zeros], axis=2) for x in (keys, values))
        bias_shape = nodes("Shape", [bias])
        batch_queries = [nodes("Slice", [bias_shape, nodes.const([s]), nodes.const([s + 1])]) for s in (0, 2)]
        per_head = nodes("Concat", [batch_queries[0], nodes.const([heads]), batch_queries[1]], axis=0)
        bias = nodes("Concat", [
            nodes("Expand", [bias, nodes("Concat", [per_head, nodes("Slice", [bias_shape, nodes.const([3]), nodes.const([4])])],
                                                    axis=0)]),
            nodes("Expand", [nodes("Reshape", [sinks, nodes.const([1, heads, 1, 1])]), nodes("Concat", [per_head, nodes.const([1])],
                                                                                                  axis=0)]),
        ], axis=3)
    scale = _attribute(kernel, "scale", 0.0)
    attended = nodes("Attention", [_heads(nodes, layer.query, heads), attended_keys, attended_values, bias],
                     **({"scale": scale} if scale else {}))
    output = nodes("Reshape", [nodes("Transpose", [attended], perm=[0, 2, 1, 3]), nodes.const([0, 0, -1])])
    # the buffers after the step: row i holds the row's held token T - L + i
    if window > 0:
        kept = nodes("Max", [capacity, nodes("Min", [nodes.const(window), rows.most])])
        remaining = _resident(nodes, rows.after, kept, window)
    else:
        kept, remaining = nodes("Max", [capacity, rows.most]), rows.after
    rows_out = nodes.unsqueeze(nodes("Range", [zero, kept, one]), 0)
    token = nodes("Add", [nodes.unsqueeze(nodes("Sub", [rows.after, remaining]), 1), rows_out])
    before = nodes.unsqueeze(rows.past, 1)
    last_new = nodes("Sub", [rows.new, one])
    nth_new = nodes("Min", [nodes("Max", [nodes("Sub", [token, before]), zero]), last_new])
    from_new = nodes("Add", [capacity, nodes("GatherElements", [rows.held_index, nth_new], axis=1)])
    slot = nodes("Where", [nodes("Less", [token, before]), nodes("Sub", [token, nodes.unsqueeze(first, 1)]), from_new])
    slot = nodes("Where", [nodes("Less", [rows_out, nodes.unsqueeze(remaining, 1)]), slot, zero])  # the rest: any row
    slot = nodes("Min", [nodes("Max", [slot, zero]), nodes("Sub", [nodes("Add", [capacity, rows.new]), one])])
    # the index's shape: (B, kv heads, kept, D)
    shape = nodes("Shape", [past_key])
    target = nodes("Concat", [nodes("Slice", [shape, nodes.const([0]), nodes.const([2])]), nodes.unsqueeze(kept, 0),
                              nodes("Slice", [shape, nodes.const([3]), nodes.const([4])])], axis=0)
    index = nodes("Expand", [nodes.unsqueeze(slot, 1, 3), target])
    presents = [nodes("GatherElements", [cache, index], axis=2) for cache in (keys, values)]
    return [output, *presents]


def _layers(graph: onnx.GraphProto) -> dict[int, _Layer]:
    """By node index, the layers whose guard this rewrites: an `If` whose first branch is
    the kernel alone (without the bias) and whose second computes the rotations then
    chooses between the kernel with the bias and the exact form."""
    found = {}
    for index, node in enumerate(graph.node):
        if node.op_type != "If":
            continue
        branches = {a.name: a.g for a in node.attribute}
        fast, padded = branches.get("then_branch"), branches.get("else_branch")
        if fast is None or padded is None or len(fast.node) != 1 or (fast.node[0].domain, fast.node[0].op_type) != _KERNEL:
            continue
        if not padded.node or padded.node[-1].op_type != "If":
            continue
        inner = {a.name: a.g for a in padded.node[-1].attribute}["then_branch"]
        with_bias = next((n for n in inner.node if (n.domain, n.op_type) == _KERNEL), None)
        kernel = fast.node[0]
        if with_bias is None or {a.name for a in kernel.attribute} - _COMPUTED:
            continue
        found[index] = _Layer(kernel=kernel, query=with_bias.input[0], key=with_bias.input[1],
                              rotations=list(padded.node[:-1]), window=_attribute(kernel, "local_window_size", -1),
                              outputs=list(fast.output))
    return found


def _kernel_graph(layer: _Layer, rows: _Rows, name: str, windowed: bool) -> onnx.GraphProto:
    """The layer's kernel counting its slots in held tokens, on a window-sized buffer
    (`sliding_window_cache`) when ``windowed``."""
    inputs = list(layer.kernel.input) + [""] * (_QUERY_SEQLENS + 1 - len(layer.kernel.input))
    inputs[5], inputs[6], inputs[10], inputs[_QUERY_SEQLENS] = rows.seqlens, rows.total, "", rows.query_seqlens
    attributes = {a.name: helper.get_attribute_value(a) for a in layer.kernel.attribute}
    suffix = "windowed_kernel" if windowed else "held_kernel"
    if windowed:
        attributes["sliding_window_cache"] = 1
    outputs = [f"{name}/{suffix}_{i}" for i in range(3)]
    node = helper.make_node("GroupQueryAttention", inputs, outputs, name=f"{name}/{suffix}", domain=_KERNEL[0], **attributes)
    return helper.make_graph([node], f"{name}_{suffix}", [], _typed(outputs, layer.outputs))


def _kernel_branch(layer: _Layer, rows: _Rows, name: str, holds_window: str | None) -> onnx.GraphProto:
    """The kernel a layer runs: a sliding layer's on its window-sized buffer where the
    buffer holds the window (``holds_window``), else (a buffer shorter than the window:
    nothing is evicted while the sequence fits it) without `sliding_window_cache`."""
    if layer.window <= 0:
        return _kernel_graph(layer, rows, name, windowed=False)
    outputs = [f"{name}/window_or_not_{i}" for i in range(3)]
    choice = helper.make_node("If", [holds_window], outputs, name=f"{name}/window_or_not",
                              then_branch=_kernel_graph(layer, rows, name, windowed=True),
                              else_branch=_kernel_graph(layer, rows, name, windowed=False))
    return helper.make_graph([choice], f"{name}_kernel", [], _typed(outputs, layer.outputs))


def _typed(names: list[str], like: list[onnx.ValueInfoProto]) -> list[onnx.ValueInfoProto]:
    return [helper.make_tensor_value_info(n, v.type.tensor_type.elem_type, None) for n, v in zip(names, like)]


def _exact_branch(layer: _Layer, rows: _Rows, name: str) -> onnx.GraphProto:
    nodes = _Nodes(f"{name}/held_exact")
    results = _exact(nodes, layer, rows, layer.outputs[0].type.tensor_type.elem_type)
    return helper.make_graph([*layer.rotations, *nodes.nodes], f"{name}_held_exact", [], _typed(results, layer.outputs))


def _buffer_fits(nodes: _Nodes, layer: _Layer, rows: _Rows) -> tuple[str, str | None]:
    """Whether the kernel takes the layer's buffer (it holds the window, or the past and
    the new tokens of every row), and for a sliding layer whether it holds the window."""
    capacity = nodes.item(layer.kernel.input[3], 2)
    room = nodes("GreaterOrEqual", [capacity, nodes("Add", [nodes("ReduceMax", [rows.past], keepdims=0), rows.new])])
    if layer.window <= 0:
        return room, None
    holds_window = nodes("GreaterOrEqual", [capacity, nodes.const(layer.window)])
    return nodes("Or", [holds_window, room]), holds_window


def windowed_model(model: onnx.ModelProto, names: dict[str, str]) -> tuple[onnx.ModelProto, list[int], int] | None:
    """``model`` (a folder's decoder, its weights left where they are) with every guarded
    kernel counting held tokens and its sliding layers on a window-sized buffer; the
    sliding layers' indices and the window. None when it has no sliding kernel to
    rewrite (then ONNX Runtime GenAI reads the folder's decoder as it is)."""
    graph = model.graph
    layers = _layers(graph)
    windows = {layer.window for layer in layers.values() if layer.window > 0}
    inputs = {value.name for value in graph.input}
    needed = (names.get("attention_mask"), names.get("position_ids"), names.get("input_ids"))
    if not windows or len(windows) > 1 or not all(name in inputs for name in needed):
        return None
    derived = onnx.ModelProto()
    derived.CopyFrom(model)
    graph = derived.graph
    layers = _layers(graph)
    shared = _Nodes("held_tokens")  # they read only the graph's inputs: they go first
    rows = _rows(shared, needed[0], needed[2], needed[1])
    rewritten = []
    for index, node in enumerate(graph.node):
        layer = layers.get(index)
        if layer is None:
            rewritten.append(node)
            continue
        fits, holds_window = _buffer_fits(shared, layer, rows)
        condition = shared("And", [rows.right_padded, fits])
        name = node.name or f"windowed_cache_{index}"
        rewritten.append(helper.make_node(
            "If", [condition], list(node.output), name=f"{name}/held_kernel_or_exact",
            then_branch=_kernel_branch(layer, rows, name, holds_window), else_branch=_exact_branch(layer, rows, name)))
    rewritten[:0] = shared.nodes
    del graph.node[:]
    graph.node.extend(rewritten)
    sliding = _name_window_dims(graph, layers)
    return derived, sliding, windows.pop()


def _name_window_dims(graph: onnx.GraphProto, layers: dict[int, _Layer]) -> list[int]:
    """The sliding layers' indices; their cache inputs and outputs get a dim name of their
    own (their length is the buffer's, not the sequence's)."""
    sliding_inputs = {layer.kernel.input[i] for layer in layers.values() if layer.window > 0 for i in (3, 4)}
    indices = []
    for value in graph.input:
        if value.name in sliding_inputs:
            value.type.tensor_type.shape.dim[2].dim_param = "window_cache_length"
            parts = value.name.split(".")
            if len(parts) > 1 and parts[1].isdigit() and value.name.endswith(".key"):
                indices.append(int(parts[1]))
    outputs = {f"present.{i}.{kind}" for i in indices for kind in ("key", "value")}
    for value in graph.output:
        if value.name in outputs:
            value.type.tensor_type.shape.dim[2].dim_param = "window_cache_length"
    return sorted(indices)


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
