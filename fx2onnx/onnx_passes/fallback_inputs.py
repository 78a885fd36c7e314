"""The nodes only the attention guards' exact branches read, moved into those branches.

`cached_attention_guard` makes each layer's `GroupQueryAttention` an `If` whose first
branch is the kernel alone and whose second (a padded batch, several new tokens over a
cache, positions the kernel does not assume) the exact form. The exact form reads values
of the main graph that the kernel does not: the model's rotary cos and sin, its mask
expanded to the scores' shape, the sizes that expansion reads. They were computed every
step, whichever branch ran: about 20 small nodes of a float32 decode step, where the
kernel runs nearly always.

So each node of a graph whose results only the guards' second branches read (directly
or through other such nodes) becomes part of each second branch that reads it: copied
into each when several layers read it (the second branch is the rare path: the copies
cost nothing where the kernel runs), its weights still read from the enclosing graph
(initializers are never copied). The computation is the same, so the model is exact as
before; the first branches and the condition keep what they read. Linear layers never
move: a float file keeps each MatMul once, in the main graph, where tools that quantize
it find it.
"""

from __future__ import annotations

import onnx_ir as ir

from fx2onnx.onnx_passes.decoder_stack_guard import layer_guards
from fx2onnx.onnx_passes.model_graphs import has_subgraph, model_graphs, subgraph_nodes

_KEPT_OPS = frozenset({"MatMul", "Gemm", "MatMulNBits", "MatMulInteger", "Conv"})  # what quantizers look for


def _branch_owners(guards: list[ir.Node]) -> tuple[dict[ir.Node, int], set[int]]:
    """By node of a guard's second branch (at any depth), the guard's index; and the ids of
    every branch graph's outputs (a value a branch gives as it is stays where it is)."""
    owners: dict[ir.Node, int] = {}
    outputs: set[int] = set()
    for index, guard in enumerate(guards):
        for node in [guard, *subgraph_nodes(guard)]:
            for attribute in node.attributes.values():
                if attribute.type == ir.AttributeType.GRAPH:
                    outputs.update(id(value) for value in attribute.as_graph().outputs)
        exact = guard.attributes["else_branch"].as_graph()
        for node in exact:
            for inner in [node, *subgraph_nodes(node)]:
                owners[inner] = index
    return owners, outputs


def _fallback_readers(graph: ir.Graph | ir.Function, owners: dict[ir.Node, int],
                      branch_outputs: set[int]) -> dict[ir.Node, set[int]]:
    """By node of ``graph`` that only the guards' second branches read (directly or through
    such nodes), the indices of the guards that read it."""
    readers: dict[ir.Node, set[int]] = {}
    for node in reversed(list(graph)):  # the readers of a node come after it
        if node.op_type in _KEPT_OPS or has_subgraph(node) or not node.outputs:
            continue
        guards: set[int] = set()
        movable = True
        for value in node.outputs:
            if value.is_graph_output() or id(value) in branch_outputs:
                movable = False
            for use in value.uses():
                if use.node in readers:
                    guards |= readers[use.node]
                elif use.node in owners:
                    guards.add(owners[use.node])
                else:
                    movable = False
        if movable and guards:
            readers[node] = guards
    return readers


def _copy_into(branch: ir.Graph, nodes: list[ir.Node], reading: set[ir.Node], suffix: str) -> None:
    """Copies of ``nodes`` (in order) at the start of ``branch``, read by the nodes of
    ``reading`` (the branch's, at any depth) instead of the originals."""
    copies: list[ir.Node] = []
    mapped: dict[ir.Value, ir.Value] = {}
    for node in nodes:
        copy = ir.node(node.op_type, [None if v is None else mapped.get(v, v) for v in node.inputs],
                       attributes=dict(node.attributes), domain=node.domain, overload=node.overload,
                       num_outputs=len(node.outputs), name=f"{node.name}{suffix}" if node.name else None)
        for old, new in zip(node.outputs, copy.outputs):
            new.name = f"{old.name}{suffix}" if old.name else None
            new.type, new.shape, new.const_value = old.type, old.shape, old.const_value
            mapped[old] = new
        copies.append(copy)
    for old, new in mapped.items():
        for use in list(old.uses()):
            if use.node in reading:
                use.node.replace_input_with(use.idx, new)
    first = next(iter(branch), None)
    if first is None:
        branch.extend(copies)
    else:
        branch.insert_before(first, copies)


def move_into_fallbacks(model: ir.Model) -> int:
    """The nodes only the layer guards' second branches read, moved into them (copied into
    each that reads them); returns how many nodes left the graphs they were in."""
    moved = 0
    for graph in list(model_graphs(model)):
        guards = layer_guards(graph)  # type: ignore[arg-type]
        if not guards:
            continue
        owners, branch_outputs = _branch_owners(guards)
        readers = _fallback_readers(graph, owners, branch_outputs)
        if not readers:
            continue
        ordered = [node for node in graph if node in readers]
        for index, guard in enumerate(guards):
            mine = [node for node in ordered if index in readers[node]]
            if mine:
                reading = {node for node, owner in owners.items() if owner == index}
                _copy_into(guard.attributes["else_branch"].as_graph(), mine, reading, f"/fallback{index}")
        for node in ordered:
            for position in range(len(node.inputs)):  # no longer a reader of what it read
                node.replace_input_with(position, None)
        graph.remove(ordered, safe=True)
        moved += len(ordered)
    return moved
