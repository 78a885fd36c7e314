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
from dispatcher import NodeRoute, OnnxFunctionDispatcher, Refusal, node_route, qualified_name_of
from dispatcher.fx_nodes import node_location, node_stack, walk_graph_modules
from fx2onnx.translate import control_flow

# An untranslatable node, why, and the dispatch decision's refusal (None for control flow).
_Unsupported = tuple[torch.fx.Node, str, Refusal | None]


def unsupported_reason(node: torch.fx.Node, dispatcher: OnnxFunctionDispatcher) -> str | None:
    """Why ``node`` cannot be translated, or None. Records no diagnostics."""
    found = _unsupported(node, dispatcher)
    return found[1] if found is not None else None


def _unsupported(node: torch.fx.Node, dispatcher: OnnxFunctionDispatcher) -> _Unsupported | None:
    if node.op != "call_function":
        return None
    route = node_route(node.target)
    if route is NodeRoute.HIGHER_ORDER:
        reason = control_flow.unsupported_reason(node)
        return (node, reason, None) if reason is not None else None
    if route is NodeRoute.ONNX_FUNCTION:
        decision = dispatcher.decide(node)  # the decision translation takes
        return (node, decision.reason, decision.refusal) if decision.reason is not None else None
    return None


def find_unsupported_nodes(graph_module: torch.fx.GraphModule, dispatcher: OnnxFunctionDispatcher) -> list[tuple[torch.fx.Node, str]]:
    """Every node of ``graph_module`` and of the graphs it calls that cannot be
    translated, with the reason."""
    return [(node, reason) for node, reason, _ in _find(graph_module, dispatcher)]


def _find(graph_module: torch.fx.GraphModule, dispatcher: OnnxFunctionDispatcher) -> list[_Unsupported]:
    found = (_unsupported(node, dispatcher) for _, node in walk_graph_modules(graph_module))
    return [item for item in found if item is not None]


def _grouped(unsupported: list[_Unsupported]) -> list[list[_Unsupported]]:
    """The unsupported nodes grouped by operator and reason, in graph order: a model with
    one unsupported operator in every layer gets one problem, not one per layer."""
    groups: dict[tuple[str, str, Refusal | None], list[_Unsupported]] = {}
    for item in unsupported:
        node, reason, refusal = item
        groups.setdefault((_operator_name(node), reason, refusal), []).append(item)
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
    unsupported = _find(graph_module, dispatcher)
    for group in _grouped(unsupported):
        node, reason, refusal = group[0]
        nodes = [member for member, _, _ in group]
        name = _operator_name(node)
        properties = {"fx_node": node.name, "operator": name, "fx_nodes": [n.name for n in nodes], "count": len(nodes)}
        if refusal is Refusal.WRONG_KIND:  # under FXE0011, as dispatch reports it
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
    return [node for node, _, _ in unsupported]


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
