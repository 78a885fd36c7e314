"""Remove reshapes, views, expands, slices and copies that return their input's shape unchanged,
and collapse chains of reshapes into one.

Models reshape to the shape a tensor already has (``attn_output.reshape(batch, heads,
seq, dim)`` right after attention, ``x.view(x.shape)``) and copy tensors for memory
layout (``clone``, ``contiguous``). In ONNX, which has no strides, each is a node that does
nothing; inside module functions the optimizer cannot see the shapes to remove them,
so they are removed here, where every shape is known from the FakeTensor metadata.
A concatenation whose other parts are empty is its one filled part.
A reshape of a reshape (or of a flatten or unflatten) is a reshape of the first input
(row-major order is kept), which also holds across a module boundary (an attention
block's output reshape followed by the projection's flattening view), where the ONNX
optimizer sees two functions.
"""

from __future__ import annotations

from collections.abc import Callable
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
        # a slice of every element (x[:, :, None] with dynamic sizes leaves slice(x, dim, 0, 2**63 - 1))
        _aten.slice.Tensor,
    }
)


def _known_int(size: Any) -> Any:
    """``size`` as an int when it is one or a symbol the capture fixed to one (a dim marked
    dynamic that the model's weights made static), else as it is."""
    if isinstance(size, torch.SymInt):
        fixed = size.node.maybe_as_int()
        return fixed if fixed is not None else size
    return size


def same_size(a: Any, b: Any) -> bool:
    """Sizes known equal without a guard: equal ints, or the same symbolic expression."""
    a, b = _known_int(a), _known_int(b)
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt):
        return a.node.expr == b.node.expr
    return False


RESHAPES = frozenset({_aten.view.default, _aten.reshape.default, _aten._unsafe_view.default})
# what only regroups its input's dims in row-major order, its shape given otherwise: a
# reshape may read through it
_REGROUPINGS = RESHAPES | {_aten.flatten.using_ints, _aten.unflatten.int}


def _reshaped_source(node: torch.fx.Node) -> torch.fx.Node | None:
    """The input of the reshape ``node`` reshapes, when ``node`` is a reshape of one."""
    if node.op != "call_function" or node.target not in RESHAPES or not node.args:
        return None
    source = node.args[0]
    if isinstance(source, torch.fx.Node) and source.op == "call_function" and source.target in _REGROUPINGS:
        return source
    return None


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
        and all(same_size(x, y) for x, y in zip(before.shape, after.shape))
    )


def _sole_filled_part(node: torch.fx.Node) -> torch.fx.Node | None:
    """The one part of the concatenation ``node`` that is not empty, when the others are
    empty by shape (a rotation over the whole head, ``cat([rotated, x[..., d:]])``)."""
    if node.op != "call_function" or node.target != _aten.cat.default or not node.args[0]:
        return None
    result = node.meta.get("val")
    parts = [(part, part.meta.get("val")) for part in node.args[0] if isinstance(part, torch.fx.Node)]
    if len(parts) != len(node.args[0]) or not isinstance(result, torch.Tensor):
        return None
    dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % result.dim()
    filled = [part for part, value in parts if not (isinstance(value, torch.Tensor) and value.dim() == result.dim()
                                                   and isinstance(value.shape[dim], int) and value.shape[dim] == 0)]
    if len(filled) != 1:
        return None
    value = filled[0].meta.get("val")
    same = value.dtype == result.dtype and all(same_size(x, y) for x, y in zip(value.shape, result.shape))
    return filled[0] if same else None


def remove_identity_views(
    graph_module: torch.fx.GraphModule, on_removed: Callable[[torch.fx.Node], None] | None = None
) -> int:
    """Replace every identity by its input and read every reshape of a reshape from the
    first input; returns how many nodes were removed. ``on_removed`` is told of each
    identity before it goes (the report records it as the node's translation)."""
    removed = 0
    for node in list(graph_module.graph.nodes):
        inner = _reshaped_source(node)
        if inner is not None:
            node.update_arg(0, inner.args[0])
            if not inner.users:
                graph_module.graph.erase_node(inner)
                removed += 1
        kept = node.args[0] if _is_identity(node) else _sole_filled_part(node)
        if kept is not None:
            if on_removed is not None:
                on_removed(node)
            node.replace_all_uses_with(kept)
            graph_module.graph.erase_node(node)
            removed += 1
    if removed:
        graph_module.recompile()
    return removed
