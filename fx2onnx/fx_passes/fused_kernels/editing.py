"""How the fused-kernel rules edit the FX graph: every node a rule's ``replace`` makes
comes from :func:`new_call` (one metadata policy: the source metadata of the node it
stands in for, ``node_meta.call_in_place_of``), and the driver erases, with
:func:`erase_unused_tree`, what the replaced nodes alone read."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from fx2onnx.fx_passes.node_meta import call_in_place_of


def new_call(graph: torch.fx.Graph, target: Any, args: tuple[Any, ...], source: torch.fx.Node | None, like: Any = None,
             **kwargs: Any) -> torch.fx.Node:
    """A call of ``target`` at the graph's insertion point with the source metadata of
    ``source`` (None: a node of no source, like the inputs every layer shares), its value
    made like ``like`` (a FakeTensor, a tuple of them, or a SymInt the caller computed)
    or, without ``like``, computed on the arguments' FakeTensors."""
    leaves = pytree.tree_leaves((like, args, kwargs), is_leaf=lambda x: isinstance(x, torch.fx.Node))
    modes = (getattr(leaf.meta.get("val") if isinstance(leaf, torch.fx.Node) else leaf, "fake_mode", None) for leaf in leaves)
    fake_mode = next((mode for mode in modes if mode is not None), None)
    if fake_mode is None:
        raise ValueError(f"no FakeTensor among the operands of the new {target} call: fused kernels need the graph's values")
    return call_in_place_of(graph, target, args, kwargs, source.meta if source is not None else {}, fake_mode, like)


def erase_unused_tree(node: Any, erased: set[torch.fx.Node], replaced: torch.fx.Node | None = None) -> None:
    """Erase ``node`` and, depth first, what only it read, while nothing else reads them
    (each erased node joins ``erased``). ``replaced``: a node the rewrite replaced, erased
    though torch calls it impure (attention, whose dropout draws random numbers)."""
    if not isinstance(node, torch.fx.Node) or node in erased or node.op != "call_function" or node.users:
        return
    if node.is_impure() and node is not replaced:
        return
    inputs = list(node.all_input_nodes)
    node.graph.erase_node(node)
    erased.add(node)
    for source in inputs:
        erase_unused_tree(source, erased, replaced)
