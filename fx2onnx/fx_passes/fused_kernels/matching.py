"""What the fused-kernel rules share: the shape of a rule (:class:`FusionRule`), what its
read-only ``match`` gives (:class:`Match`, a :class:`Refusal` with its reason, or None),
the target they fuse for, and reading the FX graph around an anchor (arguments by name,
single users, the operands of commutative products and sums in either order, heads split
from and merged into projections)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dispatcher.fx_nodes import node_value  # the rules read node values from here too
from fx2onnx.fx_passes.remove_identity_views import RESHAPES, same_size

_aten = torch.ops.aten

# The opset from which every rule applies (Attention and RotaryEmbedding are new in 23).
FUSED_KERNELS_OPSET = 23

FLOATS_ORT_RUNS = (torch.float32, torch.float16)  # onnxruntime's CPU kernels of the fused ops

ONNXRUNTIME, STANDARD = "onnxruntime", "standard"  # the runtimes a model may be exported for

# The kernels of the portable target: OpenVINO 2026.4 loses the head count of the query
# after its RotaryEmbedding and returns an empty tensor from Attention with fewer key/value
# heads than query heads at symbolic dims; TVM 0.27 has neither. Gelu (opset 20) they run.
PORTABLE_KERNELS = frozenset({"Gelu"})


@dataclass(frozen=True)
class FusionTarget:
    """What the rules may assume of the model's runtime and inputs.

    ``runtime``: ``"onnxruntime"`` allows its own kernels (``com.microsoft``) where they
    are faster; ``"standard"`` keeps to ONNX's operators. ``causal_mask``: the placeholder
    of a (B, total) input of ones from which every attention mask of the model is built
    as causal attention over the tokens it holds, the new ones last (transformers'
    decoders), a sliding layer's within its window of held tokens (``window_mask``);
    None when the masks are the model's own. ``portable``: the portable target,
    whose runtimes (OpenVINO, TVM) misread or lack the other kernels, takes only those of
    ``PORTABLE_KERNELS``."""

    runtime: str = ONNXRUNTIME
    causal_mask: str | None = None
    # the portable target: only the kernels every runtime computes alike (PORTABLE_KERNELS)
    portable: bool = False


@dataclass(frozen=True)
class Match:
    """What a rule's ``match`` found at its anchor node; each rule's subclass holds the
    nodes and operands its ``replace`` reads."""

    anchor: torch.fx.Node


@dataclass(frozen=True)
class Refusal:
    """The anchor is the rule's pattern, but its kernel cannot take it: ``reason`` says
    why (recorded as a note, FXE0010)."""

    reason: str


# (node, the node that takes over its uses): what a rule's ``replace`` made, for the driver
# to rewire and to erase what the replaced nodes alone read.
Replacements = Sequence[tuple[torch.fx.Node, torch.fx.Node]]


@dataclass(frozen=True)
class FusionRule:
    """One fused kernel: the operator a match starts from (``anchor``), the ONNX operator
    it becomes (``kernel``, which notes name), the opset that kernel needs, whether every
    node of the anchor's operator is the rule's pattern (``whole_operator``: an ``add`` is
    not always a rotation), a read-only ``match`` and the ``replace`` that makes the new
    calls (before the replaced nodes, in their source metadata, see ``editing.new_call``)."""

    name: str
    kernel: str
    anchor: Any
    opset: int
    whole_operator: bool
    match: Callable[[torch.fx.Node, FusionTarget], Match | Refusal | None]
    replace: Callable[[torch.fx.Graph, Any], Replacements]  # (graph, the rule's own Match)


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


def operand_orders(node: Any, targets: Any) -> list[tuple[Any, Any]]:
    """``[(a, b), (b, a)]`` when ``node`` is ``a op b`` for a commutative ``op`` among
    ``targets`` (a sum without ``alpha``), else ``[]``: the one place rules read the two
    operands of a product or a sum in either order."""
    if not isinstance(node, torch.fx.Node) or node.target not in targets or len(node.args) != 2:
        return []
    if node.kwargs.get("alpha", 1) != 1:
        return []
    first, second = node.args
    return [(first, second), (second, first)]


PRODUCTS, SUMS = (_aten.mul.Tensor,), (_aten.add.Tensor, _aten.add.Scalar)


def other_factor(product: Any, factor: torch.fx.Node) -> Any:
    """``b`` when ``product`` is ``factor * b`` or ``b * factor``, else None."""
    return next((other for one, other in operand_orders(product, PRODUCTS) if one is factor), None)


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
