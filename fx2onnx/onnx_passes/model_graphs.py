"""Every graph of a model a pass must visit: the main graph, every model-local function
body and every sub-graph (If/Loop/Scan bodies) inside either, at any depth."""

from __future__ import annotations

from collections.abc import Iterator

import onnx_ir as ir


def model_graphs(model: ir.Model) -> Iterator[ir.Graph | ir.Function]:
    """The main graph, the function bodies, then the sub-graphs found in them."""
    pending: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
    while pending:
        container = pending.pop(0)
        yield container
        for node in container:
            for attribute in node.attributes.values():
                if attribute.type == ir.AttributeType.GRAPH:
                    pending.append(attribute.as_graph())
                elif attribute.type == ir.AttributeType.GRAPHS:
                    pending.extend(attribute.as_graphs())


def model_nodes(model: ir.Model) -> Iterator[ir.Node]:
    """Every node of every graph of ``model``."""
    for container in model_graphs(model):
        yield from container


def has_subgraph(node: ir.Node) -> bool:
    """Whether ``node`` holds graphs (an `If`'s branches, a `Loop`'s or `Scan`'s body)."""
    return any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values())


def subgraph_nodes(node: ir.Node) -> set[ir.Node]:
    """Every node of ``node``'s sub-graphs (an `If`'s branches), nested ones included."""
    inside: set[ir.Node] = set()
    for attribute in node.attributes.values():
        if attribute.type == ir.AttributeType.GRAPH:
            inside.update(ir.traversal.RecursiveGraphIterator(attribute.as_graph()))
        elif attribute.type == ir.AttributeType.GRAPHS:
            for graph in attribute.as_graphs():
                inside.update(ir.traversal.RecursiveGraphIterator(graph))
    return inside


__all__ = ["has_subgraph", "model_graphs", "model_nodes", "subgraph_nodes"]
