"""Functionalize an aten-level GraphModule that still holds in-place ops.

torch.export already hands over functional graphs; a GraphModule given directly (e.g. from
`make_fx`) may still mutate intermediates, views of them, or its inputs. ONNX has no
mutation, so the graph is re-traced through `torch.func.functionalize`: an in-place op on
a view becomes the functional op plus a `*_scatter` of the result into the view's base,
and an input that is mutated ends in one `copy_` into its placeholder. Those `copy_`
nodes are then lifted into extra outputs, mirroring torch.export's "user input mutation"
outputs: the output becomes `((new value of each mutated input, ...), user outputs)` and
`graph_module.meta[INPUT_MUTATIONS]` lists the mutated inputs' names in that order.
"""

from __future__ import annotations

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
from torch._guards import detect_fake_mode
from torch.fx.experimental.proxy_tensor import make_fx

from dispatcher.fx_nodes import placeholder_nodes

# graph_module.meta key: names of the inputs whose new values lead the graph's outputs
INPUT_MUTATIONS = "fx2onnx_input_mutations"


def has_in_place_ops(graph_module: torch.fx.GraphModule) -> bool:
    """True when some node is an operator that mutates one of its arguments."""
    return any(
        node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and node.target._schema.is_mutable
        for node in graph_module.graph.nodes
    )


def functionalize_graph_module(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A functional equivalent of ``graph_module`` (itself when it has no in-place ops).

    Placeholders must carry FakeTensor ``meta["val"]``; the result's nodes carry theirs,
    and its placeholders keep the original names.
    """
    if not has_in_place_ops(graph_module):
        return graph_module
    placeholders = placeholder_nodes(graph_module)
    examples = [n.meta.get("val") for n in placeholders]
    fake_mode = detect_fake_mode([e for e in examples if isinstance(e, torch.Tensor)])

    def run(*inputs: object) -> object:
        return torch.fx.Interpreter(graph_module).run(*inputs)

    functional = torch.func.functionalize(run, remove="mutations")  # views stay views: ONNX has them as ops
    with fx_traceback.preserve_node_meta():
        if fake_mode is not None:
            with fake_mode:
                traced = make_fx(functional, tracing_mode="real")(*examples)
        else:
            traced = make_fx(functional, tracing_mode="fake")(*examples)

    new_placeholders = placeholder_nodes(traced)
    for old, new in zip(placeholders, new_placeholders):
        new.target = old.target
        new._rename(old.name)
    _lift_input_mutations(traced, new_placeholders)
    return traced


def _lift_input_mutations(graph_module: torch.fx.GraphModule, placeholders: list[torch.fx.Node]) -> None:
    """Turn each trailing `copy_(input, new_value)` into an extra output."""
    graph = graph_module.graph
    inputs = set(placeholders)
    mutated: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in list(graph.nodes):
        if (
            node.op == "call_function"
            and node.target is torch.ops.aten.copy_.default
            and node.args[0] in inputs
        ):
            # the copy returns its destination: later readers read the new value
            node.replace_all_uses_with(node.args[1])
            mutated[node.args[0]] = node.args[1]
            graph.erase_node(node)
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    ordered = [p for p in placeholders if p in mutated]
    output.args = ((tuple(mutated[p] for p in ordered), output.args[0]),)
    graph_module.meta[INPUT_MUTATIONS] = [p.name for p in ordered]
    graph_module.recompile()
