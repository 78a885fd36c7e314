"""What the fused-kernel rules share: what a rewrite returns, the target they fuse for,
and reading and editing the FX graph around a match (arguments by name, single users,
heads split from and merged into projections, erasing what a rewrite left unused)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dispatcher.fx_nodes import node_value  # the rules read node values from here too
from fx2onnx.fx_passes.remove_identity_views import RESHAPES, same_size

_aten = torch.ops.aten

FLOATS_ORT_RUNS = (torch.float32, torch.float16)  # onnxruntime's CPU kernels of the fused ops

# What a rule's rewrite says of a node: replaced, not the rule's pattern (nothing to say),
# or the reason it stays unfused (recorded as a note).
FUSED, NOT_THE_PATTERN = True, False


@dataclass(frozen=True)
class FusedOtherwise:
    """Replaced, though not by the kernel the rule tried first: ``reason`` says why (a note)."""

    reason: str


ONNXRUNTIME, STANDARD = "onnxruntime", "standard"  # the runtimes a model may be exported for


@dataclass(frozen=True)
class FusionTarget:
    """What the rules may assume of the model's runtime and inputs.

    ``runtime``: ``"onnxruntime"`` allows its own kernels (``com.microsoft``) where they
    are faster; ``"standard"`` keeps to ONNX's operators. ``causal_mask``: the placeholder
    of a (B, total) input of ones from which every attention mask of the model is built
    as causal attention over the tokens it holds, the new ones last (transformers'
    decoders); None when the masks are the model's own."""

    runtime: str = ONNXRUNTIME
    causal_mask: str | None = None



def arguments(node: torch.fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name, defaults filled in."""
    schema = node.target._schema  # type: ignore[union-attr]
    bound = {arg.name: arg.default_value for arg in schema.arguments if arg.has_default_value()}
    bound.update({arg.name: value for arg, value in zip(schema.arguments, node.args)})
    bound.update(node.kwargs)
    return bound


def only_user(node: torch.fx.Node) -> torch.fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None



def is_heads_transpose(node: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.target == _aten.transpose.int and sorted(node.args[1:3]) == [1, 2]


def split_heads(node: Any) -> torch.fx.Node | None:
    """``x`` (B, S, heads * D) when ``node`` is ``transpose(view(x, [B, S, heads, D]), 1, 2)``."""
    if not is_heads_transpose(node) or not isinstance(node.args[0], torch.fx.Node) or node.args[0].target not in RESHAPES:
        return None
    source = node.args[0].args[0]
    packed, split = node_value(source), node_value(node.args[0])
    if packed is None or split is None or packed.dim() != 3 or split.dim() != 4:
        return None
    return source if same_size(split.shape[0], packed.shape[0]) and same_size(split.shape[1], packed.shape[1]) else None


COPIES = {_aten.contiguous.default, _aten.clone.default}  # the same values, maybe laid out anew


def heads_merge(node: torch.fx.Node) -> torch.fx.Node | None:
    """The reshape of ``transpose(node, 1, 2)`` (copies between allowed) that alone reads
    the attention's output, if there is one: a reshape of the (B, S, heads * D) layout."""
    transposed = only_user(node)
    merged = only_user(transposed) if is_heads_transpose(transposed) else None
    while merged is not None and merged.target in COPIES:  # `.contiguous()` before the reshape
        merged = only_user(merged)
    return merged if merged is not None and merged.target in RESHAPES and node_value(merged) is not None else None


def merged_heads(node: torch.fx.Node) -> torch.fx.Node | None:
    """:func:`heads_merge` when it gives (B, S, heads * D) itself."""
    merged = heads_merge(node)
    if merged is None or node_value(merged).dim() != 3:
        return None
    result, split = node_value(merged), node_value(node)
    return merged if same_size(result.shape[1], split.shape[2]) and same_size(result.shape[0], split.shape[0]) else None





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
