"""The metadata a node made to replace another inherits from it: where in the user's code
it comes from, and in which module call (what diagnostics and module functions read)."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

SOURCE_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node")


def call_in_place_of(
    graph: torch.fx.Graph, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], replaced_meta: dict[str, Any],
    fake_mode: Any, like: Any = None,
) -> torch.fx.Node:
    """A call of ``target`` at the graph's insertion point, with the source metadata of
    the node it stands in for and its result computed on the arguments' FakeTensors, or,
    when the caller knows it has the size, strides and dtype of the FakeTensor ``like``
    (or of each FakeTensor of a tuple ``like``; a size, a SymInt, is taken as it is),
    made so (computing it again costs much with symbolic sizes). The result is made
    first: when that raises, the graph is left unchanged."""
    if like is not None:
        with fake_mode:
            value = pytree.tree_map_only(
                torch.Tensor, lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device), like
            )
    else:
        values, value_kwargs = pytree.tree_map_only(torch.fx.Node, lambda n: n.meta["val"], (args, kwargs))
        with fake_mode:
            value = target(*values, **value_kwargs)
    node = graph.call_function(target, args, kwargs)
    node.meta.update({key: replaced_meta[key] for key in SOURCE_META if key in replaced_meta})
    node.meta["val"] = value
    return node
