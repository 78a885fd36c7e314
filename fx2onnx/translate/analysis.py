"""The analysis stage: every node that cannot be translated is found and reported up
front, all at once, each at the user's source line.

It walks the graph and every graph it calls (module calls, and the branches and bodies
of control flow), and asks the same question translation asks (`dispatcher.node_route`):
nodes given to the dispatcher are checked against the registry, control-flow operators
against what `fx2onnx.translate.control_flow` translates.
"""

from __future__ import annotations

import torch
import torch.fx

from diagnostics import DiagnosticContext, Level, rules
from dispatcher import NodeRoute, OnnxFunctionDispatcher, WrongKindOfFunction, node_location, node_route, node_stack, qualified_name_of, walk_graph_modules
from fx2onnx.translate import control_flow


def unsupported_reason(node: torch.fx.Node, dispatcher: OnnxFunctionDispatcher) -> str | None:
    """Why ``node`` cannot be translated, or None. Records no diagnostics."""
    if node.op != "call_function":
        return None
    route = node_route(node.target)
    if route is NodeRoute.HIGHER_ORDER:
        return control_flow.unsupported_reason(node)
    if route is NodeRoute.ONNX_FUNCTION:
        return dispatcher.unsupported_reason(node)
    return None


def find_unsupported_nodes(graph_module: torch.fx.GraphModule, dispatcher: OnnxFunctionDispatcher) -> list[tuple[torch.fx.Node, str]]:
    """Every node of ``graph_module`` and of the graphs it calls that cannot be
    translated, with the reason."""
    found = []
    for _, node in walk_graph_modules(graph_module):
        reason = unsupported_reason(node, dispatcher)
        if reason is not None:
            found.append((node, reason))
    return found


def _grouped(unsupported: list[tuple[torch.fx.Node, str]]) -> list[list[tuple[torch.fx.Node, str]]]:
    """The unsupported nodes grouped by operator and reason, in graph order: a model with
    one unsupported operator in every layer gets one problem, not one per layer."""
    groups: dict[tuple[str, str, bool], list[tuple[torch.fx.Node, str]]] = {}
    for node, reason in unsupported:
        key = (_operator_name(node), str(reason), isinstance(reason, WrongKindOfFunction))
        groups.setdefault(key, []).append((node, reason))
    return list(groups.values())


def _nodes_text(nodes: list[torch.fx.Node], shown: int = 5) -> str:
    """``FX node 'a'`` or ``12 FX nodes alike ('a', 'b', ... and 9 more)``."""
    if len(nodes) == 1:
        return f"FX node '{nodes[0].name}'"
    names = ", ".join(f"'{node.name}'" for node in nodes[:shown])
    rest = f" and {len(nodes) - shown} more" if len(nodes) > shown else ""
    return f"{len(nodes)} FX nodes alike ({names}{rest})"


def report_unsupported_nodes(
    graph_module: torch.fx.GraphModule, dispatcher: OnnxFunctionDispatcher, context: DiagnosticContext
) -> list[torch.fx.Node]:
    """Record one error (FXE0012) per operator and reason that cannot be translated, at
    the first such node's line, with how many nodes share it; return every such node."""
    unsupported = find_unsupported_nodes(graph_module, dispatcher)
    for group in _grouped(unsupported):
        node, reason = group[0]
        nodes = [member for member, _ in group]
        name = _operator_name(node)
        properties = {"fx_node": node.name, "operator": name, "fx_nodes": [n.name for n in nodes], "count": len(nodes)}
        if isinstance(reason, WrongKindOfFunction):
            context.record(
                rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION,
                Level.ERROR,
                f"{reason}, but {_nodes_text(nodes)} ({_torch_spelling(node)}) takes "
                f"{'complex' if 'complex' in reason else 'no complex'} tensors. Register one with "
                "OnnxRegistry.register_op(..., is_complex=...) and pass ExportOptions(onnx_registry=...).",
                location=node_location(node),
                stack=node_stack(node),
                properties=properties,
            )
            continue
        context.record(
            rules.UNSUPPORTED_FX_NODE_ANALYSIS,
            Level.ERROR,
            location=node_location(node),
            stack=node_stack(node),
            target=name,
            reason=(
                f"{reason} ({_nodes_text(nodes)}), and PyTorch has no decomposition for it. Register a function "
                "with OnnxRegistry.register_op and pass ExportOptions(onnx_registry=...), or rewrite "
                "the model with supported operators."
            ),
            properties=properties,
        )
    return [node for node, _ in unsupported]


def _torch_spelling(node: torch.fx.Node) -> str:
    """The node's operator as torch prints it, with the operator it was decomposed from
    (``prims.mul.default, from aten.mul.Tensor``)."""
    text = str(node.target)
    original = node.meta.get("original_aten")
    if original is None:  # torch's provenance record: the nodes this one was made from
        sources = node.meta.get("from_node") or ()
        original = getattr(sources[0], "target", None) if sources else None
    if original is not None and str(original) != text:
        text += f", from {original}"
    return text


def _operator_name(node: torch.fx.Node) -> str:
    try:
        return qualified_name_of(node.target)
    except ValueError:
        name = getattr(node.target, "name", None)
        return name() if callable(name) else str(node.target)
