"""PyTorch's view primitives, written again as the ATen view operators that compute them.

A decomposition traced node by node (`decompose_unsupported`) may leave `torch._refs`'
primitives in the graph: `std` and `var` keep their reduced dims with
`prims::broadcast_in_dim`, `flatten` collapses dims with `prims::collapse_view`. Those whose
result aliases their input (`Tensor(a)` in their schema) cannot be functionalized, which
re-tracing the whole program (`run_decompositions`) does: "Found a custom (non-ATen)
operator whose output has alias annotations". Before that re-trace they are rewritten as
ATen views, which functionalization knows (ONNX has no views: the translation computes the
same).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

_prims = torch.ops.prims


def _broadcast_in_dim(a: torch.Tensor, shape: Sequence[Any], broadcast_dimensions: Sequence[int]) -> torch.Tensor:
    # the result's dims not in broadcast_dimensions are new: size 1, then expanded
    for dim in range(len(shape)):
        if dim not in broadcast_dimensions:
            a = a.unsqueeze(dim)
    return a.expand(list(shape))


def _collapse_view(a: torch.Tensor, start: int, end: int) -> torch.Tensor:
    # dims start to end, both included, become one
    return a.flatten(start, end)


def _split_dim(a: torch.Tensor, dim: int, outer_length: Any) -> torch.Tensor:
    return a.unflatten(dim, (outer_length, a.shape[dim] // outer_length))


# primitive -> the same view in ATen operators (traced, so symbolic sizes stay symbolic)
VIEWS_IN_ATEN: dict[Any, Callable[..., torch.Tensor]] = {
    _prims.broadcast_in_dim.default: _broadcast_in_dim,
    _prims.collapse_view.default: _collapse_view,
    _prims.split_dim.default: _split_dim,
    _prims.squeeze.default: lambda a, dimensions: a.squeeze(tuple(dimensions)) if dimensions else a.view(a.shape),
    _prims.transpose.default: lambda a, permutation: a.permute(list(permutation)),
    _prims.view_of.default: lambda a: a.view(a.shape),
    _prims.view_of_dtype.default: lambda a, dtype: a.view(dtype),
}


def aliasing_prims(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The graph's calls of a view primitive `VIEWS_IN_ATEN` rewrites."""
    return [node for node in graph.nodes if node.op == "call_function" and node.target in VIEWS_IN_ATEN]


def rewrite_aliasing_prims(graph_module: torch.fx.GraphModule, replace: Callable[..., None]) -> int:
    """Replace each call of a view primitive in ``graph_module`` by its ATen views
    (``replace(graph, node, decomposition)`` traces and inlines them); the count replaced."""
    nodes = aliasing_prims(graph_module.graph)
    for node in nodes:
        replace(graph_module.graph, node, VIEWS_IN_ATEN[node.target])
    if nodes:
        graph_module.graph.lint()
        graph_module.recompile()
    return len(nodes)
