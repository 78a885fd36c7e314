"""Remove reshapes, views, expands and copies that return their input's shape unchanged.

Models reshape to the shape a tensor already has (``attn_output.reshape(batch, heads,
seq, dim)`` right after attention, ``x.view(x.shape)``) and copy tensors for memory
layout (``clone``, ``contiguous``). In ONNX, which has no strides, each is a node that does
nothing; inside module functions the optimizer cannot see the shapes to remove them,
so they are removed here, where every shape is known from the FakeTensor metadata.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

_aten = torch.ops.aten

# Operators that are identities in ONNX when the output shape and dtype equal the input's.
_IDENTITY_WHEN_SAME_SHAPE = frozenset(
    {
        _aten.view.default,
        _aten.reshape.default,
        _aten._unsafe_view.default,
        _aten.expand.default,
        _aten.alias.default,
        _aten.clone.default,
    }
)


def _same_size(a: Any, b: Any) -> bool:
    """Sizes known equal without a guard: equal ints, or the same symbolic expression."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt):
        return a.node.expr == b.node.expr
    return False


def _is_identity(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target not in _IDENTITY_WHEN_SAME_SHAPE:
        return False
    source = node.args[0] if node.args else None
    if not isinstance(source, torch.fx.Node):
        return False
    before, after = source.meta.get("val"), node.meta.get("val")
    if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor):
        return False
    return (
        before.dtype == after.dtype
        and before.dim() == after.dim()
        and all(_same_size(x, y) for x, y in zip(before.shape, after.shape))
    )


def remove_identity_views(graph_module: torch.fx.GraphModule) -> int:
    """Replace every such node by its input; returns how many were removed."""
    removed = 0
    for node in list(graph_module.graph.nodes):
        if _is_identity(node):
            node.replace_all_uses_with(node.args[0])
            graph_module.graph.erase_node(node)
            removed += 1
    if removed:
        graph_module.recompile()
    return removed
