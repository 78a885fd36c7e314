"""The rotary embedding of a `GroupQueryAttention`'s query and key inside the kernel.

The kernel rotates its query and key itself (``do_rotary``) from tables of each position's
cos and sin (``cos_cache``/``sin_cache``, (positions, rotary dim / 2)), which saves two
`RotaryEmbedding` nodes a layer. It does not read the model's ``position_ids``: it puts
the new tokens of every sequence at ``total_length - S`` onwards (its ``seqlens_k`` is
``total - 1`` for every sequence, `group_query_attention`), so the guard
(`cached_attention_guard`) runs the kernel with the rotation inside only where the
positions are those (:func:`positions_as_kernel_assumes`, checked at run time), and
rotates as before elsewhere (left-padded batches, shifted positions, totals past the
tables).

The tables are the model's own: the nodes that compute the rotations' cos and sin from
``position_ids`` run once in onnxruntime on the positions ``0 .. TABLE_POSITIONS - 1``
(or as many as the model is made for, `ExportOptions.context_length`: the tables are a
folder's largest float weights after the embedding in int4).
They are used only when the cos and sin depend on the position alone (default, linear,
Llama 3, YaRN scalings), which is checked on a second, shuffled batch of positions: a
scaling that depends on the length (LongRoPE's switch, dynamic NTK past the table) gives
other numbers there and keeps the rotations as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from fx2onnx.onnx_passes.model_graphs import has_subgraph
from fx2onnx.onnx_passes.runtime_folding import run_in_onnxruntime

# positions the tables hold: a step whose total is larger rotates outside the kernel
TABLE_POSITIONS = 4096
# positions of two sequences, shuffled: what the tables must give row by row
_PROBE = np.array([[3, 0, 7, 1, 5], [2, 6, 6, 4, 0]], np.int64)



@dataclass(frozen=True)
class KernelRotary:
    """What a kernel reads to rotate its query and key itself."""

    query: ir.Value  # the query and key before their rotations
    key: ir.Value
    rotations: tuple[ir.Node, ir.Node]  # the RotaryEmbedding nodes the kernel replaces
    cos_cache: ir.Value  # (TABLE_POSITIONS, rotary dim / 2) initializers
    sin_cache: ir.Value
    positions: ir.Value  # the model input the tables are computed from
    interleaved: int


@dataclass
class RotaryTables:
    """A graph's rotary tables, computed once per pair of cos and sin values and written
    once per content, for all its kernels."""

    positions: int = TABLE_POSITIONS  # the tables' rows
    computed: dict[tuple[int, int], Any] = field(default_factory=dict)  # by (id(cos), id(sin)): _tables
    written: dict[tuple[bytes, bytes], tuple[ir.Value, ir.Value]] = field(default_factory=dict)  # by content


def _rotation(value: ir.Value | None) -> ir.Node | None:
    """The standard `RotaryEmbedding` producing ``value`` from per-token tables (no
    position ids, the whole head rotated), read by nothing else."""
    node = None if value is None else value.producer()
    if node is None or (node.domain, node.op_type) not in (("", "RotaryEmbedding"), ("ai.onnx", "RotaryEmbedding")):
        return None
    readers = [use.node for use in value.uses() if use.node.op_type != "Shape"]  # a shape is the input's too
    if len([i for i in node.inputs if i is not None]) != 3 or len(readers) != 1 or value.is_graph_output():
        return None
    partial = node.attributes.get("rotary_embedding_dim")
    return None if partial is not None and partial.as_int() != 0 else node


def _subgraph(outputs: list[ir.Value]) -> tuple[set[ir.Node], list[ir.Value], list[ir.Value]] | None:
    """The nodes computing ``outputs``, the graph inputs and the initializers they read;
    None when they read something else (a node with sub-graphs)."""
    nodes: set[ir.Node] = set()
    inputs: list[ir.Value] = []
    constants: list[ir.Value] = []
    pending = list(outputs)
    while pending:
        value = pending.pop()
        producer = value.producer()
        if value.is_graph_input():
            inputs.append(value) if value not in inputs else None
        elif producer is None:
            if value.const_value is None:
                return None
            constants.append(value) if value not in constants else None
        elif producer not in nodes:
            if has_subgraph(producer):
                return None
            nodes.add(producer)
            pending.extend(v for v in producer.inputs if v is not None)
    return nodes, inputs, constants


def _evaluate(model: ir.Model, graph: ir.Graph, outputs: list[ir.Value], positions: ir.Value,
              feeds: list[np.ndarray]) -> list[list[np.ndarray]] | None:
    """``outputs`` computed by onnxruntime from each of ``feeds`` as ``positions``; None
    (logged) where it refuses."""
    found = _subgraph(outputs)
    if found is None:
        return None
    nodes, inputs, constants = found
    if inputs != [positions]:
        return None
    initializers = []
    for value in constants:
        tensor = ir.serde.serialize_tensor(ir.tensor(value.const_value.numpy()))  # in the proto, not external
        tensor.name = value.name
        initializers.append(tensor)
    ordered = [ir.serde.serialize_node(node) for node in graph if node in nodes]  # the graph's order
    proto = onnx.helper.make_model(
        onnx.helper.make_graph(ordered, "rotary_tables", [onnx.helper.make_tensor_value_info(
            positions.name, int(positions.dtype), None)], [onnx.helper.make_empty_tensor_value_info(v.name) for v in outputs],
            initializer=initializers),
        opset_imports=[onnx.helper.make_opsetid(domain, version) for domain, version in model.opset_imports.items()],
        functions=[ir.serde.serialize_function(function) for function in model.functions.values()],
    )
    proto.ir_version = model.ir_version
    return run_in_onnxruntime(proto, [{positions.name: feed.astype(positions.dtype.numpy())} for feed in feeds],
                              f"compute the rotary tables of {positions.name}")


def _tables(model: ir.Model, graph: ir.Graph, cos: ir.Value, sin: ir.Value,
            rows: int) -> tuple[np.ndarray, np.ndarray, ir.Value] | None:
    """The (rows, D / 2) tables of ``cos`` and ``sin`` (B, S, D / 2) and the
    input they are computed from, when they depend on each position alone."""
    found = _subgraph([cos, sin])
    if found is None or len(found[1]) != 1:
        return None
    positions = found[1][0]
    if positions.dtype not in (ir.DataType.INT64, ir.DataType.INT32):
        return None
    results = _evaluate(model, graph, [cos, sin], positions, [np.arange(max(rows, _PROBE.max() + 1))[None], _PROBE])
    if results is None:
        return None
    (cos_table, sin_table), probed = (table[0] for table in results[0]), results[1]
    if any(table[_PROBE].shape != probe.shape or not np.array_equal(table[_PROBE], probe)
           for table, probe in zip((cos_table, sin_table), probed)):
        return None  # another length gives other numbers: the tables are not the position's alone
    return cos_table[:rows], sin_table[:rows], positions


def kernel_rotary(model: ir.Model, graph: ir.Graph, kernel: ir.Node, tables_of_graph: RotaryTables) -> KernelRotary | None:
    """How ``kernel`` rotates its query and key itself, when both come from a
    `RotaryEmbedding` of equal tables that depend on the position alone (the tables kept
    in ``tables_of_graph``)."""
    rotations = _rotation(kernel.inputs[0]), _rotation(kernel.inputs[1])
    if rotations[0] is None or rotations[1] is None or kernel.attributes.get("do_rotary") is not None:
        return None
    interleaved = {r.attributes["interleaved"].as_int() if "interleaved" in r.attributes else 0 for r in rotations}
    tables = [_tables_once(model, graph, rotation, tables_of_graph) for rotation in rotations]
    if len(interleaved) != 1 or tables[0] is None or tables[1] is None or tables[0][2] is not tables[1][2] \
            or any(not np.array_equal(q, k) for q, k in zip(tables[0][:2], tables[1][:2])):
        return None  # the query and key rotate alike, or the rotations stay
    if not _kernel_rotates(kernel, tables[0][0]):
        return None
    content = (tables[0][0].tobytes(), tables[0][1].tobytes())
    written = tables_of_graph.written
    if content not in written:
        written[content] = _as_initializers(graph, tables[0][:2], len(written))
    cos_cache, sin_cache = written[content]
    query, key = rotations[0].inputs[0], rotations[1].inputs[0]
    assert query is not None and key is not None
    return KernelRotary(query, key, (rotations[0], rotations[1]), cos_cache, sin_cache, tables[0][2], interleaved.pop())


def _kernel_rotates(kernel: ir.Node, cos_table: np.ndarray) -> bool:
    """Whether onnxruntime's kernel rotates heads of this size: the whole head (the table
    half its size), a multiple of 16 (the kernel refuses others)."""
    query, heads = kernel.inputs[0], kernel.attributes["num_heads"].as_int()
    width = None if query is None or query.shape is None else query.shape[-1]
    if not isinstance(width, int) or width % heads:
        return False
    head_size = width // heads
    return head_size % 16 == 0 and cos_table.shape[-1] * 2 == head_size


def _tables_once(model: ir.Model, graph: ir.Graph, rotation: ir.Node, tables_of_graph: RotaryTables) -> Any:
    """:func:`_tables` of ``rotation``'s cos and sin, computed once per pair."""
    cos, sin = rotation.inputs[1], rotation.inputs[2]
    if cos is None or sin is None:
        return None
    key, computed = (id(cos), id(sin)), tables_of_graph.computed
    if key not in computed:
        computed[key] = _tables(model, graph, cos, sin, tables_of_graph.positions)
    return computed[key]


def _as_initializers(graph: ir.Graph, tables: tuple[np.ndarray, np.ndarray], index: int) -> tuple[ir.Value, ir.Value]:
    values = []
    for name, table in zip(("cos_cache", "sin_cache"), tables):
        value = ir.Value(name=f"rotary_{name}_{index}", const_value=ir.tensor(np.ascontiguousarray(table)))
        value.shape, value.dtype = ir.Shape(table.shape), value.const_value.dtype
        graph.register_initializer(value)
        values.append(value)
    return values[0], values[1]


def read_shapes_before(rotation: ir.Node) -> None:
    """The `Shape` nodes reading ``rotation``'s result read its input instead (of the same
    shape), so that the rotation can move into a branch."""
    result, rotated = rotation.outputs[0], rotation.inputs[0]
    for use in list(result.uses()):
        if use.node.op_type == "Shape":
            use.node.replace_input_with(use.idx, rotated)


def positions_as_kernel_assumes(nodes: Any, positions: ir.Value, past: ir.Value, total: ir.Value,
                                rows: int = TABLE_POSITIONS) -> ir.Value:
    """Whether every sequence's positions are ``past .. total - 1`` (the kernel's, with the
    new tokens last in the mask; ``past`` and ``total`` int64 scalars) and within the
    tables of ``rows`` positions; ``nodes`` makes the nodes (`cached_attention_guard`'s)."""
    expected = nodes("Range", [past, total, nodes.constant(1)])
    # position ids are int64 (a Cast of them would be a node a step for nothing)
    given = positions if positions.dtype == ir.DataType.INT64 else nodes("Cast", [positions], to=ir.DataType.INT64)
    all_same = nodes("ReduceMin", [nodes("Equal", [given, expected])], keepdims=0)  # of (B, S) booleans
    return nodes("And", [all_same, nodes("LessOrEqual", [total, nodes.constant(rows)])])
