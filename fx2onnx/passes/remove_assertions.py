"""Remove runtime assertion nodes: they check tensor metadata, symbolic ranges or the
success of a linear-algebra routine in PyTorch and have no meaning in a static ONNX graph."""

from __future__ import annotations

import torch
import torch.fx

ASSERTION_OPS = {
    torch.ops.aten._assert_tensor_metadata.default,
    torch.ops.aten._assert_scalar.default,
    torch.ops.aten._assert_async.default,
    torch.ops.aten._assert_async.msg,
    torch.ops.aten.sym_constrain_range.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
    torch.ops.aten._functional_assert_async.msg,
    torch.ops.aten._functional_sym_constrain_range.default,
    torch.ops.aten._functional_sym_constrain_range_for_size.default,
    torch.ops.aten._linalg_check_errors.default,  # raises on singular input in PyTorch
}


def remove_assertions(graph_module: torch.fx.GraphModule) -> int:
    """Erase assertion nodes that nothing uses; returns how many were removed."""
    removed = 0
    for node in list(graph_module.graph.nodes):
        if node.op == "call_function" and node.target in ASSERTION_OPS and not node.users:
            graph_module.graph.erase_node(node)
            removed += 1
    if removed:
        graph_module.recompile()
    return removed
