"""One guard for a decoder's whole stack instead of one a layer.

`cached_attention_guard` makes each `GroupQueryAttention` an `If` whose first branch is
the kernel alone, on a condition computed once in the main graph from the model's inputs
(the lengths, the mask's padding, the positions): every layer takes the same branch. Each
layer's `If` still costs onnxruntime an execution frame per step (about 20 us on one
core, several percent of a small int4 decode step), and the nodes only the other branches
read (the attention bias, the rotations' cos and sin) run in the main graph whether a
branch reads them or not.

So the main graph becomes the condition's nodes and one `If`: the condition reads the
model's inputs and their shapes only, so its first branch is the rest of the model (the
embedding and the head too) with every layer's kernel in place of its `If` (what the
layers' first branches compute when the condition holds, exactly), the second branch the same
nodes with the layers' `If`s as they are (each layer still choosing its own exact
branch). Both branches read the weights as outer initializers: the file holds them once,
and the nodes that read only weights (a packing's `Concat` of codes) stay in the main
graph, folded once.

Why one `If` rather than each layer's `If` reading the shared condition: the layers
already share it (the guard computes it once a graph), so what a layer still costs is
its frame; one `If` pays one. Measured on a 4 x 512 int4 LLaMA decode step
(`bench/int4_decode_profile.py --node-medians`, `bench/step_cpu_time.py`, thread CPU
time on a loaded machine), the one `If` gave 0.98-1.00x the model builder's step where
the per-layer guards gave 1.10-1.17x, with a noise of several percent.

Only for quantized weights (`ExportOptions.precision`): a float32 step is long enough
that the frames are about 1% of it (a float folder with one guard for its stack timed
within the runs' resolution of the per-layer one: 0.96x and 1.01x the builder's against
0.97x and 0.95x, on one quiet run), and a float file is what tools rewrite: it keeps
each layer once, in the main graph, where every tool finds it (onnxruntime's
`MatMulNBitsQuantizer` does enter an `If`'s branches, and quantizes each branch's
MatMuls).
"""

from __future__ import annotations

import onnx_ir as ir

from fx2onnx.onnx_passes.model_graphs import has_subgraph, subgraph_nodes

STACK_GUARD = "decoder_stack/kernels_or_guarded"  # the If's name
EXACT_SUFFIX = "_guarded"  # the second branch's outputs: the model's outputs' names with it
_STACK_SUFFIX = "_layers_fast"  # the first branch's copies of the model's values


def layer_guards(graph: ir.Graph) -> list[ir.Node]:
    """The guard `If`s of ``graph``: a first branch of one `GroupQueryAttention` alone."""
    guards = []
    for node in graph:
        if node.op_type != "If" or node.domain not in ("", "ai.onnx") or "then_branch" not in node.attributes:
            continue
        then_nodes = list(node.attributes["then_branch"].as_graph())
        if len(then_nodes) == 1 and then_nodes[0].op_type == "GroupQueryAttention":
            guards.append(node)
    return guards


def _ancestors(values: list[ir.Value], graph: ir.Graph) -> set[ir.Node]:
    """The nodes of ``graph`` that ``values`` are computed from."""
    found: set[ir.Node] = set()
    pending = [value.producer() for value in values]
    while pending:
        node = pending.pop()
        if node is None or node in found or node.graph is not graph:
            continue
        found.add(node)
        pending.extend(value.producer() for value in node.inputs if value is not None)
    return found


def _weights_only(graph: ir.Graph) -> set[ir.Node]:
    """The nodes of ``graph`` that read no graph input (a packing's `Concat` of codes):
    kept in the main graph, onnxruntime folds them once rather than once a branch."""
    found: set[ir.Node] = set()
    for node in graph:
        if has_subgraph(node):
            continue
        if all(value is None or value.is_initializer() or value.producer() in found for value in node.inputs):
            found.add(node)
    return found


def _conditions(guards: list[ir.Node]) -> list[ir.Value]:
    """The layers' conditions, each once (one when they share it, as they usually do)."""
    conditions: list[ir.Value] = []
    for guard in guards:
        if guard.inputs[0] is not None and guard.inputs[0] not in conditions:
            conditions.append(guard.inputs[0])
    return conditions


def _joined(graph: ir.Graph, conditions: list[ir.Value], before: ir.Node) -> ir.Value:
    """Whether every one of ``conditions`` holds, computed before ``before``."""
    condition = conditions[0]
    for other in conditions[1:]:
        joined = ir.node("And", [condition, other], name=f"{other.name}/and_stack")
        graph.insert_before(before, joined)
        condition = joined.outputs[0]
        condition.name, condition.dtype, condition.shape = f"{other.name}_and_stack", ir.DataType.BOOL, ir.Shape([])
    return condition


def _inline_first_branches(branch: ir.Graph) -> None:
    """Each layer guard of ``branch`` replaced by its first branch's kernel."""
    for guard in layer_guards(branch):
        inner = guard.attributes["then_branch"].as_graph()
        kernel = next(iter(inner))
        inner.outputs.clear()
        inner.remove(kernel)
        branch.insert_before(guard, kernel)
        for old, new in zip(guard.outputs, kernel.outputs):
            new.type, new.shape = old.type, old.shape
            ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
        branch.remove(guard, safe=True)


def _remove_unread(branch: ir.Graph) -> None:
    """The nodes of ``branch`` its outputs do not need (the bias and rotations the
    kernels do without). Reached from the outputs: a removed guard's branches still name
    the values they read."""
    needed: set[ir.Node] = set()
    pending = [value.producer() for value in branch.outputs]
    while pending:
        node = pending.pop()
        if node is None or node in needed or node.graph is not branch:
            continue
        needed.add(node)
        pending.extend(value.producer() for inner in [node, *subgraph_nodes(node)] for value in inner.inputs
                       if value is not None)
    unneeded = [node for node in branch if node not in needed]
    for node in unneeded:
        for index in range(len(node.inputs)):  # no longer a reader of the values it read
            node.replace_input_with(index, None)
    branch.remove(unneeded)


def _renamed(branch: ir.Graph, suffix: str) -> None:
    """Every value ``branch`` computes named with ``suffix`` (a branch's names may repeat
    neither the main graph's nor the other branch's)."""
    for node in branch:
        for value in node.outputs:
            if value.name is not None:
                value.name = f"{value.name}{suffix}"


def guard_decoder_stack(model: ir.Model) -> int:
    """``model``'s main graph as its layers' condition and one `If` between the stack of
    kernels and the stack of guarded layers; returns how many layer guards it joined."""
    graph = model.graph
    guards = layer_guards(graph)
    outputs = list(graph.outputs)
    if len(guards) < 2 or len({id(v) for v in outputs}) != len(outputs):
        return 0
    conditions = _conditions(guards)
    kept = _ancestors(conditions, graph) | _weights_only(graph)
    stack = [node for node in graph if node not in kept]
    if not conditions or any(value.producer() not in stack for value in outputs):
        return 0  # an output the condition's nodes compute, or an input: left as it is
    condition = _joined(graph, conditions, guards[0])
    for node in stack:
        graph.remove(node)
    graph.outputs.clear()
    exact = ir.Graph([], outputs, nodes=stack, name="decoder_stack_exact")
    fast = exact.clone(allow_outer_scope_values=True)
    fast.name = "decoder_stack_fast"
    _inline_first_branches(fast)
    _remove_unread(fast)
    _renamed(fast, _STACK_SUFFIX)
    names = [value.name for value in outputs]
    choice = ir.node("If", [condition], attributes={"then_branch": fast, "else_branch": exact},
                     num_outputs=len(outputs), name=STACK_GUARD)
    graph.append(choice)
    for value, result, name in zip(outputs, choice.outputs, names):
        value.name = f"{name}{EXACT_SUFFIX}"
        result.name, result.type, result.shape = name, value.type, value.shape
    graph.outputs[:] = list(choice.outputs)
    return len(guards)
