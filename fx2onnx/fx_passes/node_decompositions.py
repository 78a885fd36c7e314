"""Replace single FX nodes by PyTorch's decomposition of their operator.

The decomposition stage uses torch.export's core table; functionalization produces ops
outside it that ONNX has no function for (`diagonal_scatter`, `as_strided_scatter`: ours
are index_put on the view's positions), and
the ONNX function of training-mode batch norm computes with the running statistics
(inference semantics) and leaves them unchanged; in evaluation mode it fills the saved
statistics that PyTorch returns empty (`fx2onnx.fx_passes.batch_norm` computes both as
PyTorch does, without writing into the running statistics). Each such node is traced alone through
its entry in `torch._decomp.decomposition_table` (under the graph's fake mode, so
symbolic sizes stay symbolic) and the traced nodes are inlined in its place, keeping the
node's source location and module stack.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch._decomp import decomposition_table

from diagnostics import DiagnosticContext, Level, rules
from dispatcher import OnnxRegistry
from dispatcher.fx_nodes import node_location, node_stack
from fx2onnx.fx_passes.decompose_unsupported import inline_trace as _inline
from fx2onnx.fx_passes.decompose_unsupported import onnx_decomposition_table
from fx2onnx.fx_passes.decompose_unsupported import trace_alone as _trace_alone
from fx2onnx.fx_passes.batch_norm import batch_norm_with_saved_statistics, uses_saved_statistics
from fx2onnx.private_ops import training_batch_norm_ops

def _lstm_with_projections(node: torch.fx.Node) -> bool:
    """aten.lstm with proj_size: hidden and cell states differ in width. torchlib's
    function builds ONNX's LSTM, which has no projection; PyTorch's decomposition has."""
    states = [value.meta.get("val") for value in node.args[1]] if isinstance(node.args[1], (list, tuple)) else []
    return len(states) == 2 and all(isinstance(s, torch.Tensor) for s in states) and states[0].shape[-1] != states[1].shape[-1]


# Operators whose ONNX function covers some uses only: a node of another use is decomposed.
_NOT_COVERED_USES = {torch.ops.aten.lstm.input: _lstm_with_projections}


def _needs_decomposition(node: torch.fx.Node, registry: OnnxRegistry) -> bool:
    target = node.target
    if target not in decomposition_table and target not in _own_decompositions():
        return False
    if target in _NOT_COVERED_USES and _NOT_COVERED_USES[target](node):
        return True
    training_batch_norm = training_batch_norm_ops()
    if target in training_batch_norm:
        position = training_batch_norm[target]
        training = len(node.args) > position and node.args[position] is True
        # in evaluation, torchlib's function fills the saved statistics PyTorch leaves empty
        return training or (target in _own_decompositions() and uses_saved_statistics(node))
    return not registry.is_supported(target)


def _diagonal_scatter(
    input: torch.Tensor, src: torch.Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1
) -> torch.Tensor:
    # PyTorch's own decomposition goes through prims; this one is an index_put on the
    # diagonal's (row, column) positions, with the two dims moved to the front.
    moved = input.movedim((dim1, dim2), (0, 1))
    steps = torch.arange(src.shape[-1], device=input.device)
    rows = steps + max(-offset, 0)
    columns = steps + max(offset, 0)
    updated = moved.index_put((rows, columns), src.movedim(-1, 0))
    return updated.movedim((0, 1), (dim1, dim2))


def _as_strided_scatter(
    input: torch.Tensor, src: torch.Tensor, size: list[int], stride: list[int], storage_offset: int | None = None
) -> torch.Tensor:
    # The functional base is contiguous: the strided view's elements are the positions
    # offset + sum(index_k * stride_k) of the flattened base.
    positions = torch.full((), storage_offset or 0, dtype=torch.int64, device=input.device)
    for axis, (length, step) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[axis] = -1
        positions = positions + (torch.arange(length, device=input.device) * step).reshape(shape)
    flat = input.reshape(-1).index_put((positions.reshape(-1),), src.reshape(-1))
    return flat.reshape(input.shape)


@functools.cache
def _own_decompositions() -> dict[Any, Callable]:
    return {
        torch.ops.aten.diagonal_scatter.default: _diagonal_scatter,
        torch.ops.aten.as_strided_scatter.default: _as_strided_scatter,
        torch.ops.aten.native_batch_norm.default: batch_norm_with_saved_statistics,
        torch.ops.aten._native_batch_norm_legit.default: batch_norm_with_saved_statistics,
    }


def _table(registry: OnnxRegistry) -> dict:
    """torch.export's table plus every torch decomposition of an operator ONNX lacks."""
    table = onnx_decomposition_table(registry)
    for op, decomposition in decomposition_table.items():
        if op not in table and isinstance(op, torch._ops.OpOverload) and not registry.is_supported(op):
            if op.namespace == "aten":
                table[op] = decomposition
    table.update(_own_decompositions())
    return table


def decompose_nodes(
    graph_module: torch.fx.GraphModule, registry: OnnxRegistry, context: DiagnosticContext | None = None
) -> int:
    """Inline PyTorch's decomposition of nodes ONNX cannot compute faithfully; returns
    how many nodes were replaced. A node whose decomposition cannot be inlined stays
    as it is, with a note in ``context``."""
    table = None  # built only when some node needs it
    replaced = 0
    for node in list(graph_module.graph.nodes):
        if node.op != "call_function" or not _needs_decomposition(node, registry):
            continue
        table = table if table is not None else _table(registry)
        try:
            decomposition = _own_decompositions().get(node.target, decomposition_table.get(node.target))
            traced = _trace_alone(node, decomposition, table)
            _inline(graph_module.graph, node, traced)
        except NotImplementedError as error:
            if context is not None:
                context.record(
                    rules.FX_PASS,
                    Level.NOTE,
                    message=f"decompose_nodes keeps '{node.name}' ({node.target}) whole: {error}",
                    location=node_location(node),
                    stack=node_stack(node),
                )
            continue
        replaced += 1
    if replaced:
        graph_module.graph.lint()
        graph_module.recompile()
    return replaced
