"""A `GroupQueryAttention` that reads its query, key and value as one packed tensor.

Where the three are the outputs of one `Split` of a (B, S, (heads + 2 kv heads) * D)
tensor (the packed projections of `packed_projections`), in that order, the kernel takes
the packed tensor as its query and no key or value: the `Split` then runs only where the
query, key and value are needed apart (the guard's other branches,
`cached_attention_guard`), and the layer reads its projections in one piece as ONNX
Runtime GenAI's own folders do.
"""

from __future__ import annotations

import onnx_ir as ir

from fx2onnx.onnx_passes.model_graphs import subgraph_nodes


def packed_input(query: ir.Value, key: ir.Value | None, value: ir.Value | None) -> ir.Node | None:
    """The `Split` whose outputs are exactly ``query``, ``key`` and ``value`` along the last
    axis, when nothing reads them but the kernel, their rotations and shapes of the first
    two axes (which the packed tensor has too)."""
    split = query.producer()
    if split is None or (split.domain, split.op_type) not in (("", "Split"), ("ai.onnx", "Split")):
        return None
    if list(split.outputs) != [query, key, value] or split.inputs[0] is None:
        return None
    axis, shape = split.attributes["axis"].as_int() if "axis" in split.attributes else 0, split.inputs[0].shape
    return split if axis == -1 or (shape is not None and axis == len(shape) - 1) else None


def reads_leading_axes(node: ir.Node) -> bool:
    """Whether ``node`` is a `Shape` of the first two axes at most (batch and tokens)."""
    if node.op_type != "Shape":
        return False
    start = node.attributes["start"].as_int() if "start" in node.attributes else 0
    end = node.attributes["end"].as_int() if "end" in node.attributes else None
    return 0 <= start and end is not None and 0 < end <= 2


def _packing(guard: ir.Node) -> tuple[ir.Node, ir.Node] | None:
    """(the first branch's kernel, the `Split` it can read packed) of a guard `If`."""
    then_branch = guard.attributes["then_branch"].as_graph() if "then_branch" in guard.attributes else None
    kernels = [] if then_branch is None else [n for n in then_branch if n.op_type == "GroupQueryAttention"]
    if len(kernels) != 1 or len(kernels[0].inputs) < 3 or kernels[0].inputs[0] is None:
        return None
    kernel = kernels[0]
    split = packed_input(kernel.inputs[0], kernel.inputs[1], kernel.inputs[2])
    if split is None:
        return None
    inside = subgraph_nodes(guard)
    if any(use.node not in inside and not reads_leading_axes(use.node) for output in split.outputs for use in output.uses()):
        return None  # read elsewhere: the Split stays where it is
    return kernel, split


def pack_attention_inputs(model: ir.Model) -> int:
    """Each guarded `GroupQueryAttention` of ``model``'s main graph whose query, key and
    value are one `Split`'s outputs reads the packed tensor in its first branch, and the
    `Split` moves into the second; returns how many."""
    packed = 0
    for guard in list(model.graph):
        found = _packing(guard) if guard.op_type == "If" else None
        if found is None:
            continue
        kernel, split = found
        tensor = split.inputs[0]
        for output in split.outputs:
            for use in list(output.uses()):
                if reads_leading_axes(use.node):
                    use.node.replace_input_with(use.idx, tensor)
        for index, value in enumerate((tensor, None, None)):
            kernel.replace_input_with(index, value)
        model.graph.remove(split)
        else_branch = guard.attributes["else_branch"].as_graph()
        else_branch.insert_before(next(iter(else_branch)), split)
        packed += 1
    return packed
