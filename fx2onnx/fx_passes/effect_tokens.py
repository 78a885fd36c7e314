"""Unwrap side-effect ordering: `with_effects(token, op, *args)` becomes a plain call of `op`.

torch.export threads an effect token through operators that have side effects (runtime
checks such as `_linalg_check_errors`, custom operators registered with effects) so that
PyTorch keeps their order. ONNX graphs have no side effects to order: each wrapped
operator becomes an ordinary node, dispatched like any other (or reported by name when it
has no ONNX function), and the token placeholders and outputs disappear.
"""

from __future__ import annotations

import operator
from collections.abc import Collection

import torch
import torch.fx

from fx2onnx.private_ops import with_effects_op


def remove_effect_tokens(graph_module: torch.fx.GraphModule, token_names: Collection[str]) -> int:
    """Unwrap every `with_effects` node and drop the token placeholders (named in the
    graph signature); returns how many nodes were unwrapped. Token outputs become None:
    they are not graph outputs."""
    graph = graph_module.graph
    unwrapped = 0
    with_effects = with_effects_op()
    for node in list(graph.nodes):
        if node.op == "call_function" and with_effects is not None and node.target is with_effects:
            _unwrap(graph, node)
            unwrapped += 1
    tokens = [node for node in graph.nodes if node.op == "placeholder" and node.name in token_names]
    if not tokens and not unwrapped:
        return 0
    output = next(node for node in reversed(graph.nodes) if node.op == "output")
    token_set = set(tokens)
    output.args = torch.fx.node.map_arg(output.args, lambda arg: None if arg in token_set else arg)
    for token in tokens:
        if not token.users:
            graph.erase_node(token)
    graph_module.recompile()
    return unwrapped


def _unwrap(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    token, op, *op_args = node.args
    with graph.inserting_before(node):
        call = graph.call_function(op, tuple(op_args), dict(node.kwargs))
    call.meta = dict(node.meta)
    # with_effects returns (token, result) or (token, *results)
    results = tuple(node.meta.get("val") or ())[1:]
    single_result = len(results) == 1
    if results:
        call.meta["val"] = results[0] if single_result else results
    for user in list(node.users):
        if user.op == "call_function" and user.target is operator.getitem:
            index = user.args[1]
            if index == 0:
                user.replace_all_uses_with(token)
            elif single_result:
                user.replace_all_uses_with(call)
            else:
                user.args = (call, index - 1)
                continue
            graph.erase_node(user)
    if not node.users:
        graph.erase_node(node)
