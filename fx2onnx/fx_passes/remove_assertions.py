"""Remove runtime assertion nodes: they check tensor metadata, symbolic ranges or the
success of a linear-algebra routine in PyTorch and have no meaning in a static ONNX graph.
What computed an assertion's condition alone goes with it (transformers' `torch_compilable_check`
while tracing: `_is_all_true`, `item`, `sym_ite`, a comparison)."""

from __future__ import annotations

import torch.fx

from fx2onnx.private_ops import assertion_ops


def remove_assertions(graph_module: torch.fx.GraphModule) -> int:
    """Erase assertion nodes that nothing uses, and the side-effect-free nodes that then go
    unused; returns how many assertions were removed."""
    removed = 0
    assertions = assertion_ops()
    for node in list(graph_module.graph.nodes):
        if node.op == "call_function" and node.target in assertions and not node.users:
            inputs = list(node.all_input_nodes)
            graph_module.graph.erase_node(node)
            _erase_unused(graph_module.graph, inputs)
            removed += 1
    if removed:
        graph_module.recompile()
    return removed


def _erase_unused(graph: torch.fx.Graph, nodes: list[torch.fx.Node]) -> None:
    """Erase each of ``nodes`` that computes a value nothing uses any more, then its inputs so."""
    while nodes:
        node = nodes.pop()
        if node.op != "call_function" or node.users or node.is_impure() or node.graph is not graph:
            continue
        nodes += node.all_input_nodes
        graph.erase_node(node)
