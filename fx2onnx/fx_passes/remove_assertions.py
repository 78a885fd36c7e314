"""Remove runtime assertion nodes: they check tensor metadata, symbolic ranges or the
success of a linear-algebra routine in PyTorch and have no meaning in a static ONNX graph."""

from __future__ import annotations

import torch.fx

from fx2onnx.private_ops import assertion_ops


def remove_assertions(graph_module: torch.fx.GraphModule) -> int:
    """Erase assertion nodes that nothing uses; returns how many were removed."""
    removed = 0
    assertions = assertion_ops()
    for node in list(graph_module.graph.nodes):
        if node.op == "call_function" and node.target in assertions and not node.users:
            graph_module.graph.erase_node(node)
            removed += 1
    if removed:
        graph_module.recompile()
    return removed
