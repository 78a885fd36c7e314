"""onnxruntime's `GroupQueryAttention` where it runs, the exact attention where it refuses.

The kernel refuses several new tokens over a non-empty cache for more than one sequence
("batch_size must be 1 when sequence_length > 1 and past context"): onnxruntime 1.32 lifts
that with a `query_seqlens` input that older runtimes (onnxruntime-node 1.30, which
Transformers.js runs) reject. So each kernel becomes an `If` on what it runs (one
sequence, one new token, or an empty cache): the kernel when that holds, otherwise the
same attention in standard operators, its cache the past with the new tokens written
where the kernel writes them (after the mask's `total - S` tokens; past and present stay
one buffer of the same length when the runtime shares them, and the cache grows by the
new tokens when it does not). Decode steps and prompts take the kernel, for one `If` a
layer (a few microseconds).

The kernel's attention bias (the mask's padding) costs an addition per score in every
layer, and is all zeros when no sequence is padded. So the `If`'s condition is also that
the bias is zero everywhere (checked at run time on its one row per sequence): then the
kernel runs without it, which computes the same scores exactly; otherwise a second `If`
chooses between the kernel with the bias and the exact form. An unpadded batch still
takes one `If` a layer, a padded one two.

The condition is computed once a step, in a few small nodes, from the model's inputs:
the batch and new tokens from the shape of an input of the query's first two dims
(``input_ids``: none of the layers' nodes is needed for it, so a guard of the whole stack,
`decoder_stack_guard`, holds them all), the kernel's refusal as ``(B - 1)(S - 1)(total -
S) != 0``, the bias as the mask's ``Where(held, 0, lowest)`` where it is one (every token
held implies a bias of zeros), and the positions as one reduction of their comparison.

A sliding layer's kernel (`local_window_size`) counts its window in cache slots, the
model in the tokens the mask holds: the two counts differ where a row has padding after a
held token (ONNX Runtime GenAI pads a batch on the right). Its padded branch runs the
kernel only when no row has (checked at run time on the bias), and the exact form, with
the window counted in held tokens, otherwise; unpadded and left-padded batches take the
kernel.

A kernel with attention sinks (`head_sink`, gpt-oss's) keeps them in every branch: the
kernel without the bias still reads them, and the exact form gives each head's softmax
its sink logit as the score of one more key, of zeros, whose value is zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from dispatcher.functions.fused import ONNXRUNTIME_DOMAIN
from fx2onnx.onnx_passes.appended_nodes import AppendedNodes
from fx2onnx.onnx_passes.model_graphs import model_graphs
from fx2onnx.onnx_passes.rotary_in_attention import (
    TABLE_POSITIONS, KernelRotary, RotaryTables, kernel_rotary, positions_as_kernel_assumes, read_shapes_before,
)

_ATTENTION_OPSET = 23  # the standard Attention the exact form uses
_BIAS = 10  # GroupQueryAttention's attention_bias input
_COS_CACHE, _SIN_CACHE = 7, 8
_HEAD_SINK = 11  # its head_sink input (attention sinks)


@dataclass(frozen=True)
class _StepSizes:
    """A step's sizes as int64 scalars: the mask's total, the tokens before the new ones."""

    total: ir.Value
    past: ir.Value


def _as_int64(nodes: AppendedNodes, total: ir.Value) -> ir.Value:
    """The kernel's int32 ``total`` as an int64 scalar: the int64 it was cast from, when it
    is one (the mask's length, read from its shape), rather than a Cast back each step."""
    producer = total.producer()
    source = producer.inputs[0] if producer is not None and producer.op_type == "Cast" and producer.inputs else None
    if source is not None and source.dtype == ir.DataType.INT64 and source.shape is not None and source.shape.rank() == 0:
        return source
    return nodes("Cast", [total], to=ir.DataType.INT64)


def _step_sizes(nodes: AppendedNodes, sized: ir.Value, total: ir.Value) -> tuple[ir.Value, _StepSizes]:
    """``sized``'s (batch, new tokens) and the step's sizes (``total``, the kernel's)."""
    shape = nodes("Shape", [sized], start=0, end=2)
    new = nodes("Gather", [shape, nodes.constant(1)], axis=0)
    total = _as_int64(nodes, total)
    return shape, _StepSizes(total, nodes("Sub", [total, new]))


def _kernel_runs(nodes: AppendedNodes, batch_and_new: ir.Value, sizes: _StepSizes) -> ir.Value:
    """Whether the kernel takes this step: one sequence, one new token, or no past, that
    is ``(B - 1)(S - 1)(total - S) == 0`` (each factor at least 0)."""
    refused = nodes("ReduceProd", [nodes("Sub", [batch_and_new, nodes.constant(1)])], keepdims=0)
    return nodes("Equal", [nodes("Mul", [refused, sizes.past]), nodes.constant(0)])


def _where_zero(rows: ir.Value) -> ir.Value | None:
    """The booleans ``c`` of ``rows = Where(c, 0, x)`` (through `Unsqueeze`s): where all
    hold, every row is zero."""
    producer = rows.producer()
    while producer is not None and producer.op_type == "Unsqueeze" and producer.inputs[0] is not None:
        producer = producer.inputs[0].producer()
    if producer is None or producer.op_type != "Where" or len(producer.inputs) != 3:
        return None
    condition, zero = producer.inputs[0], producer.inputs[1]
    tensor = None if zero is None else ir.convenience.get_const_tensor(zero)
    if condition is None or condition.dtype != ir.DataType.BOOL or tensor is None or np.any(tensor.numpy()):
        return None
    return condition


def _unpadded(nodes: AppendedNodes, bias: ir.Value) -> ir.Value:
    """Whether ``bias`` is zero everywhere (no padding: padding has the dtype's lowest
    number), read on its row per sequence when it is an expanded one; where the rows are
    the mask's ``Where(held, 0, lowest)``, whether every token is held (which implies it)."""
    producer = bias.producer()
    rows = producer.inputs[0] if producer is not None and producer.op_type == "Expand" else bias
    assert rows is not None and rows.dtype is not None
    held = _where_zero(rows)
    if held is not None:
        return nodes("ReduceMin", [held], keepdims=0)
    least = nodes("ReduceMin", [rows], keepdims=0)
    return nodes("Equal", [least, nodes.constant(0, rows.dtype.numpy())])


def _window(kernel: ir.Node) -> int:
    """The kernel's sliding window (`local_window_size`), -1 for none."""
    attribute = kernel.attributes.get("local_window_size")
    return -1 if attribute is None else attribute.as_int()


def _bias_rows(nodes: AppendedNodes, bias: ir.Value) -> ir.Value:
    """The bias's row per sequence (B, 1, 1, total): what it expands, or its rows' largest
    (the rows of a sequence are equal: the mask's)."""
    producer = bias.producer()
    if producer is not None and producer.op_type == "Expand" and producer.inputs[0] is not None:
        return producer.inputs[0]
    return nodes("ReduceMax", [bias, nodes.constant([2])], keepdims=1)


def _no_padding_after_held(nodes: AppendedNodes, bias: ir.Value) -> ir.Value:
    """Whether no sequence has padding after a held token: its bias never decreases along
    the tokens (padding is the dtype's lowest number, a held token 0). A window counted
    in cache slots is then the window counted in held tokens."""
    rows = _bias_rows(nodes, bias)
    axis = nodes.constant([3])
    later = nodes("Slice", [rows, nodes.constant([1]), nodes.constant([np.iinfo(np.int64).max]), axis])
    earlier = nodes("Slice", [rows, nodes.constant([0]), nodes.constant([-1]), axis])
    rises = nodes("Cast", [nodes("GreaterOrEqual", [later, earlier])], to=ir.DataType.INT64)
    return nodes("GreaterOrEqual", [nodes("ReduceMin", [rises], keepdims=0), nodes.constant(1)])


def _held_window(nodes: AppendedNodes, bias: ir.Value, past: ir.Value, total: ir.Value, window: int) -> ir.Value:
    """(B, 1, S, total) booleans: the keys among the last ``window`` tokens the mask holds
    up to each new token (the model's window, whatever the padding)."""
    rows = _bias_rows(nodes, bias)
    assert rows.dtype is not None
    held = nodes("Cast", [nodes("Equal", [rows, nodes.constant(0, rows.dtype.numpy())])], to=ir.DataType.INT64)
    counts = nodes("CumSum", [held, nodes.constant(3)])  # (B, 1, 1, total)
    as_1d = [nodes("Unsqueeze", [x, nodes.constant([0])]) for x in (past, total)]
    new_counts = nodes("Slice", [counts, as_1d[0], as_1d[1], nodes.constant([3])])
    per_query = nodes("Transpose", [new_counts], perm=[0, 1, 3, 2])  # (B, 1, S, 1)
    return nodes("Less", [nodes("Sub", [per_query, counts]), nodes.constant(window)])


def _head_sink(kernel: ir.Node) -> ir.Value | None:
    """The kernel's attention sinks (`head_sink`, one logit per query head), if it has them."""
    return kernel.inputs[_HEAD_SINK] if len(kernel.inputs) > _HEAD_SINK else None


def _zero_column(nodes: AppendedNodes, cache: ir.Value, dtype: ir.DataType) -> ir.Value:
    """``cache`` (B, heads, T, D) of ``dtype`` with one more token of zeros at the end."""
    shape = nodes("Shape", [cache])
    one_token = nodes("Concat", [nodes("Slice", [shape, nodes.constant([0]), nodes.constant([2])]), nodes.constant([1]),
                                 nodes("Slice", [shape, nodes.constant([3]), nodes.constant([4])])], axis=0)
    zeros = nodes("ConstantOfShape", [one_token], value=ir.tensor(np.zeros(1, dtype=dtype.numpy())))
    return nodes("Concat", [cache, zeros], axis=2)


def _with_sinks(nodes: AppendedNodes, keys: ir.Value, values: ir.Value, scores_bias: ir.Value, sinks: ir.Value,
                num_heads: int, dtype: ir.DataType) -> tuple[ir.Value, ir.Value, ir.Value]:
    """Keys, values and bias (B, 1, S, T) for the standard Attention with each head's sink:
    a key of zeros (its score is the bias alone) whose bias is the head's sink logit and
    whose value is zeros, so that the sink takes its share of the softmax and weighs
    nothing (B, heads, S, T + 1 bias)."""
    shape = nodes("Shape", [scores_bias])
    batch_queries = [nodes("Slice", [shape, nodes.constant([start]), nodes.constant([start + 1])]) for start in (0, 2)]
    heads, one = nodes.constant([num_heads]), nodes.constant([1])
    per_head = nodes("Expand", [scores_bias, nodes("Concat", [batch_queries[0], heads, batch_queries[1],
                                                              nodes("Slice", [shape, nodes.constant([3]), nodes.constant([4])])],
                                                   axis=0)])
    column = nodes("Expand", [nodes("Reshape", [sinks, nodes.constant([1, num_heads, 1, 1])]),
                              nodes("Concat", [batch_queries[0], heads, batch_queries[1], one], axis=0)])
    return _zero_column(nodes, keys, dtype), _zero_column(nodes, values, dtype), nodes("Concat", [per_head, column], axis=3)


def _heads(nodes: AppendedNodes, packed: ir.Value, heads: int) -> ir.Value:
    """(B, S, heads * D) as (B, heads, S, D)."""
    split = nodes("Reshape", [packed, nodes.constant([0, 0, heads, -1])])
    return nodes("Transpose", [split], perm=[0, 2, 1, 3])


def _exact_branch(kernel: ir.Node, name: str) -> ir.Graph:
    """The kernel's three results in standard operators, for any batch and lengths."""
    query, key, value, past_key, past_value, _, total_length = kernel.inputs[:7]
    bias = kernel.inputs[_BIAS]
    num_heads, kv_heads = kernel.attributes["num_heads"].as_int(), kernel.attributes["kv_num_heads"].as_int()
    scale = kernel.attributes.get("scale")
    nodes = AppendedNodes(f"{name}/exact")
    new = nodes("Gather", [nodes("Shape", [query]), nodes.constant(1)], axis=0)
    total = nodes("Cast", [total_length], to=ir.DataType.INT64)
    past = nodes("Sub", [total, new])  # the tokens before the new ones, as the mask has them
    axis, start, end = nodes.constant([2]), nodes.constant([0]), nodes.constant([np.iinfo(np.int64).max])
    as_1d = [nodes("Unsqueeze", [x, nodes.constant([0])]) for x in (past, total)]
    presents = []
    for cache, fresh in ((past_key, key), (past_value, value)):
        before = nodes("Slice", [cache, start, as_1d[0], axis])
        after = nodes("Slice", [cache, as_1d[1], end, axis])  # the rest of a shared buffer; empty otherwise
        presents.append(nodes("Concat", [before, _heads(nodes, fresh, kv_heads), after], axis=2))
    keys, values = (nodes("Slice", [present, start, as_1d[1], axis]) for present in presents)
    rows = nodes("Unsqueeze", [nodes("Range", [past, total, nodes.constant(1)]), nodes.constant([1])])
    columns = nodes("Range", [nodes.constant(0), total, nodes.constant(1)])
    lowest = nodes.constant(np.finfo(query.dtype.numpy()).min, query.dtype.numpy())
    visible = nodes("LessOrEqual", [columns, rows])
    if _window(kernel) != -1:
        visible = nodes("And", [visible, _held_window(nodes, bias, past, total, _window(kernel))])
    scores_bias = nodes("Where", [visible, bias, lowest])
    sinks = _head_sink(kernel)
    if sinks is not None:
        keys, values, scores_bias = _with_sinks(nodes, keys, values, scores_bias, sinks, num_heads, query.dtype)
    attributes = {} if scale is None else {"scale": scale.as_float()}
    attended = nodes("Attention", [_heads(nodes, query, num_heads), keys, values, scores_bias], **attributes)
    merged = nodes("Reshape", [nodes("Transpose", [attended], perm=[0, 2, 1, 3]), nodes.constant([0, 0, -1])])
    results = [merged, *presents]
    for result, model_value in zip(results, kernel.outputs):
        result.type, result.shape = model_value.type, model_value.shape
    return ir.Graph([], results, nodes=nodes.nodes, name=f"{name}_exact")


def _branch_outputs(node: ir.Node, kernel: ir.Node, suffix: str) -> list[ir.Value]:
    """``node``'s outputs typed and named as ``kernel``'s, for a branch graph."""
    for result, model_value in zip(node.outputs, kernel.outputs):
        result.name = f"{model_value.name}_{suffix}"
        result.type, result.shape = model_value.type, model_value.shape
    return list(node.outputs)


def _kernel_branch(kernel: ir.Node, name: str, bias: bool = True, rotary: KernelRotary | None = None) -> ir.Graph:
    """A graph of the kernel alone, reading the enclosing graph's values (without its
    attention bias when ``bias`` is False; its sinks, if any, kept; rotating the query
    and key itself with ``rotary``)."""
    inputs = list(kernel.inputs) if bias else [*kernel.inputs[:_BIAS], None, _head_sink(kernel)]
    attributes = dict(kernel.attributes)
    if rotary is not None:
        inputs = _rotating_inputs(inputs, rotary)
        attributes["do_rotary"] = ir.AttrInt64("do_rotary", 1)
        attributes["rotary_interleaved"] = ir.AttrInt64("rotary_interleaved", rotary.interleaved)
    while inputs and inputs[-1] is None:  # no empty optional inputs at the end
        inputs.pop()
    suffix = "kernel" if bias else "unpadded_kernel"
    inner = ir.node(kernel.op_type, inputs, attributes=attributes, domain=kernel.domain,
                    num_outputs=len(kernel.outputs), name=f"{name}/{suffix}")
    return ir.Graph([], _branch_outputs(inner, kernel, suffix), nodes=[inner], name=f"{name}_{suffix}")


def _rotating_inputs(inputs: list[ir.Value | None], rotary: KernelRotary) -> list[ir.Value | None]:
    """The kernel's inputs with the query and key before their rotations and the tables."""
    inputs = [rotary.query, rotary.key, *inputs[2:]]
    inputs += [None] * (_SIN_CACHE + 1 - len(inputs))
    inputs[_COS_CACHE], inputs[_SIN_CACHE] = rotary.cos_cache, rotary.sin_cache
    return inputs


def _moved_out(graph: ir.Graph | ir.Function, rotary: KernelRotary | None) -> list[ir.Node]:
    """The nodes only the guard's second branch needs (the rotations of the query and
    key, and what only they read: the layer's slices of the tables), taken out of
    ``graph`` in its order."""
    if rotary is None:
        return []
    for rotation in rotary.rotations:
        read_shapes_before(rotation)
    moved = set(rotary.rotations)
    pending = [value for rotation in rotary.rotations for value in rotation.inputs[1:]]  # not the query or key
    while pending:
        value = pending.pop()
        producer = None if value is None else value.producer()
        if producer is None or producer in moved or producer.graph is not graph or any(
                output.is_graph_output() or any(use.node not in moved for use in output.uses()) for output in producer.outputs):
            continue
        moved.add(producer)
        pending.extend(producer.inputs)
    ordered = [node for node in graph if node in moved]
    for node in ordered:
        graph.remove(node)
    return ordered


def _padded_branch(kernel: ir.Node, name: str, runs: ir.Value, moved: list[ir.Node]) -> ir.Graph:
    """``If(runs, kernel with its bias, exact form)`` as a graph, after the ``moved`` nodes
    (the query's and key's rotations, when the unpadded kernel rotates them itself)."""
    choice = ir.node("If", [runs], attributes={
        "then_branch": _kernel_branch(kernel, name), "else_branch": _exact_branch(kernel, name),
    }, num_outputs=len(kernel.outputs), name=f"{name}/runs_or_exact")
    return ir.Graph([], _branch_outputs(choice, kernel, "padded"), nodes=[*moved, choice], name=f"{name}_padded")


def _guard(graph: ir.Graph | ir.Function, kernel: ir.Node, runs: ir.Value, fast: ir.Value, index: int,
           rotary: KernelRotary | None = None) -> None:
    """``kernel`` replaced by ``If(fast, kernel without bias, If(runs, kernel, exact form))``
    with its output values; with ``rotary``, the first kernel rotates the query and key
    itself and the rotations move into the second branch."""
    name = kernel.name or f"GroupQueryAttention_{index}"
    moved = _moved_out(graph, rotary)
    branch = ir.node("If", [fast], attributes={
        "then_branch": _kernel_branch(kernel, name, bias=False, rotary=rotary),
        "else_branch": _padded_branch(kernel, name, runs, moved),
    }, num_outputs=len(kernel.outputs), name=f"{name}/unpadded_or_not")
    graph.insert_before(kernel, branch)
    for old, replacing in zip(kernel.outputs, branch.outputs):
        replacing.type, replacing.shape = old.type, old.shape
        old_name = old.name
        ir.convenience.replace_all_uses_with(old, replacing, replace_graph_outputs=True)
        old.name, replacing.name = f"{old_name}_replaced", old_name
    graph.remove(kernel, safe=True)


def _windowed_runs(nodes: AppendedNodes, kernels: list[ir.Node], runs: ir.Value) -> dict[int, ir.Value]:
    """By bias, when the sliding layers' kernel computes the model's window with that bias:
    it runs and no sequence has padding after a held token."""
    windowed: dict[int, ir.Value] = {}
    for kernel in kernels:
        bias = kernel.inputs[_BIAS] if len(kernel.inputs) > _BIAS else None
        if _window(kernel) != -1 and bias is not None and id(bias) not in windowed:
            windowed[id(bias)] = nodes("And", [runs, _no_padding_after_held(nodes, bias)])
    return windowed


def _kernel_rotaries(model: ir.Model, graph: ir.Graph | ir.Function, kernels: list[ir.Node],
                     tables: RotaryTables) -> dict[int, KernelRotary]:
    """By kernel, how it rotates its query and key itself (the kernels that can)."""
    if not isinstance(graph, ir.Graph):
        return {}
    found = {id(kernel): kernel_rotary(model, graph, kernel, tables) for kernel in kernels}
    return {key: rotary for key, rotary in found.items() if rotary is not None}


def _rotary_runs(nodes: AppendedNodes, rotaries: dict[int, KernelRotary], sizes: _StepSizes, rows: int) -> dict[int, ir.Value]:
    """By positions input, whether the kernel's own positions are the model's."""
    checks: dict[int, ir.Value] = {}
    for rotary in rotaries.values():
        if id(rotary.positions) not in checks:
            checks[id(rotary.positions)] = positions_as_kernel_assumes(nodes, rotary.positions, sizes.past, sizes.total,
                                                                       rows)
    return checks


def _sized_like(graph: ir.Graph | ir.Function, query: ir.Value) -> ir.Value:
    """A graph input whose first two dims are ``query``'s (batch and new tokens, the same
    symbols: ``input_ids``), else ``query``: reading an input's shape, the guards'
    condition needs none of the layers' nodes."""
    shape = query.shape
    if shape is None or len(shape) < 2 or any(isinstance(dim, ir.SymbolicDim) and dim.value is None for dim in shape[:2]):
        return query
    for value in graph.inputs:
        if value.shape is not None and len(value.shape) >= 2 and list(value.shape[:2]) == list(shape[:2]):
            return value
    return query


def guard_group_query_attention(model: ir.Model, table_positions: int = TABLE_POSITIONS) -> int:
    """Each `GroupQueryAttention` of ``model`` as an `If` that runs it where onnxruntime
    does and the exact form elsewhere; returns how many. A kernel that rotates itself
    reads tables of ``table_positions`` positions (longer steps take the exact form)."""
    if model.opset_imports.get("", 0) < _ATTENTION_OPSET:
        return 0
    guarded = 0
    for graph in list(model_graphs(model)):
        kernels = [n for n in graph if (n.domain, n.op_type) == (ONNXRUNTIME_DOMAIN, "GroupQueryAttention")]
        if not kernels:
            continue
        nodes = AppendedNodes(f"{kernels[0].name or 'GroupQueryAttention'}/kernel_runs")
        rotaries = _kernel_rotaries(model, graph, kernels, RotaryTables(positions=table_positions))
        # the query's shape before a rotation that moves into a branch
        query = rotaries[id(kernels[0])].query if id(kernels[0]) in rotaries else kernels[0].inputs[0]
        batch_and_new, sizes = _step_sizes(nodes, _sized_like(graph, query), kernels[0].inputs[6])
        runs = _kernel_runs(nodes, batch_and_new, sizes)  # the same for every layer
        fast: dict[tuple[int, int], ir.Value] = {}  # by bias and positions: the layers share one, unless they differ
        windowed = _windowed_runs(nodes, kernels, runs)
        rotary_runs = _rotary_runs(nodes, rotaries, sizes, table_positions)
        for kernel in kernels:
            bias = kernel.inputs[_BIAS] if len(kernel.inputs) > _BIAS else None
            rotary = rotaries.get(id(kernel))
            key = (id(bias), id(rotary.positions) if rotary is not None else 0)
            if key not in fast:
                condition = runs if bias is None else nodes("And", [runs, _unpadded(nodes, bias)])
                if rotary is not None:
                    condition = nodes("And", [condition, rotary_runs[id(rotary.positions)]])
                fast[key] = condition
        graph.insert_before(kernels[0], nodes.nodes)
        for kernel in kernels:
            bias = kernel.inputs[_BIAS] if len(kernel.inputs) > _BIAS else None
            rotary = rotaries.get(id(kernel))
            padded_runs = windowed.get(id(bias), runs) if _window(kernel) != -1 else runs
            key = (id(bias), id(rotary.positions) if rotary is not None else 0)
            _guard(graph, kernel, padded_runs, fast[key], guarded, rotary)
            guarded += 1
    return guarded
