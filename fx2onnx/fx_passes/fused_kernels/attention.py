"""Scaled-dot-product attention as the standard ``Attention`` (opset 23).

Causal, with a boolean or additive mask, with grouped-query heads. The repetition of key
and value heads that models write before it (transformers' ``repeat_kv``: unsqueeze,
expand, reshape) is left to the kernel, which reads each key/value head for its group of
query heads instead of copying the cache. Where the heads are split from (B, S, heads * D)
projections just before and merged just after (encoders), the kernel takes and gives that
layout, and the transposes go; for onnxruntime (``runtime="onnxruntime"``) that kernel is its
``MultiHeadAttention`` where it applies (as many key/value heads as query heads, not causal,
one mask row per query shared by the heads): onnxruntime-web's WebGPU has it and not the
standard ``Attention``, and its CPU runs it as one kernel too. What every attention kernel
needs of the node (:func:`attention_operands`) is read here; ``group_query_attention`` reads
it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from fx2onnx.fx_passes.fused_kernels import operators  # noqa: F401 - registers torch.ops.fx2onnx.*
from fx2onnx.fx_passes.fused_kernels.editing import new_call
from fx2onnx.fx_passes.fused_kernels.matching import (
    FLOATS_ORT_RUNS, FUSED_KERNELS_OPSET, ONNXRUNTIME, FusionRule, FusionTarget, Match, Refusal, Replacements, arguments, merged_heads,
    node_value, split_heads,
)
from fx2onnx.fx_passes.remove_identity_views import RESHAPES, same_size

_aten = torch.ops.aten


@dataclass(frozen=True)
class AttentionOperands:
    """The attention's operands with key and value heads unrepeated, and its head counts."""

    query: torch.fx.Node
    key: torch.fx.Node
    value: torch.fx.Node
    mask: torch.fx.Node | None
    scale: float
    is_causal: bool
    query_heads: int
    key_heads: int


def _keeps_size(size: Any, reference: Any) -> bool:
    """Whether an expand size (int, -1, or a node computing a symbolic size) keeps ``reference``."""
    size = node_value(size) if isinstance(size, torch.fx.Node) else size
    return size == -1 if isinstance(size, int) and size < 0 else same_size(size, reference)


def unrepeated_heads(node: torch.fx.Node) -> tuple[torch.fx.Node, int] | None:
    """``(x, groups)`` when ``node`` is ``x`` (B, H, L, D) with each head repeated
    ``groups`` times in a row: reshape(expand(unsqueeze(x, 2), [B, H, groups, L, D]))."""
    if node.target not in RESHAPES:
        return None
    expanded = node.args[0]
    if not isinstance(expanded, torch.fx.Node) or expanded.target != _aten.expand.default:
        return None
    unsqueezed = expanded.args[0]
    if not isinstance(unsqueezed, torch.fx.Node) or unsqueezed.target != _aten.unsqueeze.default or unsqueezed.args[1] != 2:
        return None
    source, result = unsqueezed.args[0], node_value(node)
    source_value = node_value(source)
    if source_value is None or result is None or source_value.dim() != 4 or result.dim() != 4:
        return None
    sizes = expanded.args[1]
    heads, groups = source_value.shape[1], sizes[2] if len(sizes) == 5 else None
    if not isinstance(groups, int) or not isinstance(heads, int) or result.shape[1] != heads * groups:
        return None
    same = all(_keeps_size(sizes[i], source_value.shape[j]) for i, j in ((0, 0), (1, 1), (3, 2), (4, 3)))
    return (source, groups) if same else None


def attention_operands(node: torch.fx.Node) -> AttentionOperands | Refusal:
    """The operands of the ``scaled_dot_product_attention`` ``node`` when an attention
    kernel can take them, else why not."""
    args = arguments(node)
    query, key, value, mask = args["query"], args["key"], args["value"], args.get("attn_mask")
    if args.get("dropout_p", 0.0) != 0.0:
        return Refusal("dropout (ONNX Attention has none)")
    values = [node_value(x) for x in (query, key, value)]
    if any(v is None or v.dim() != 4 for v in values):
        return Refusal("query, key and value are not all 4-D")
    if not all(same_size(v.shape[0], values[0].shape[0]) for v in values[1:]):
        return Refusal("a batch broadcast between query, key and value (the kernels take one batch size)")
    if values[0].dtype not in FLOATS_ORT_RUNS:
        return Refusal(f"{values[0].dtype} (onnxruntime's Attention runs float32 and float16)")
    mask_value = node_value(mask)
    if mask is not None and (mask_value is None or mask_value.dim() > 4):
        return Refusal("a mask of more than 4 dims")
    if mask is not None and mask_value.dtype not in (torch.bool, values[0].dtype):
        return Refusal(f"a {mask_value.dtype} mask")
    if mask is not None and (mask_value.dim() < 2 or not same_size(mask_value.shape[-2], values[0].shape[-2])):
        return Refusal("a mask shared by every query (onnxruntime's Attention takes one row per query)")
    scale, head_size = args.get("scale"), values[0].shape[-1]
    if scale is None and not isinstance(head_size, int):
        return Refusal("a symbolic head size")
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(head_size)
    unrepeated = [unrepeated_heads(x) for x in (key, value)]
    if unrepeated[0] is not None and unrepeated[1] is not None and unrepeated[0][1] == unrepeated[1][1]:
        key, value = unrepeated[0][0], unrepeated[1][0]
    query_heads, key_heads = values[0].shape[1], node_value(key).shape[1]
    if not isinstance(query_heads, int) or not isinstance(key_heads, int) or query_heads % key_heads:
        return Refusal(f"{query_heads} query heads for {key_heads} key heads")
    return AttentionOperands(query, key, value, mask, scale, bool(args.get("is_causal", False)), query_heads, key_heads)


@dataclass(frozen=True)
class AttentionMatch(Match):
    operands: AttentionOperands
    # (B, S, heads * D) projections the heads are split from, and the reshape that merges
    # the result's heads back: the kernel's own layout; None when not both
    projections: tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node] | None
    merged: torch.fx.Node | None
    # onnxruntime's MultiHeadAttention rather than the standard Attention (projections only)
    multi_head: bool = False


def _takes_multi_head(operands: AttentionOperands, target: FusionTarget) -> bool:
    """Whether onnxruntime's ``MultiHeadAttention`` computes the (projections' layout)
    attention: the target allows onnxruntime's kernels, the heads are not grouped, the
    attention is not causal, and a mask is (B or 1, 1, L, S) as its ``attention_bias``."""
    if target.runtime != ONNXRUNTIME or operands.query_heads != operands.key_heads or operands.is_causal:
        return False
    mask = node_value(operands.mask) if operands.mask is not None else None
    return mask is None or (mask.dim() == 4 and isinstance(mask.shape[1], int) and mask.shape[1] == 1)


def match(node: torch.fx.Node, target: FusionTarget) -> AttentionMatch | Refusal:
    operands = attention_operands(node)
    if isinstance(operands, Refusal):
        return operands
    packed = [split_heads(x) for x in (operands.query, operands.key, operands.value)]
    merged = merged_heads(node)
    if packed[0] is not None and packed[1] is not None and packed[2] is not None and merged is not None:
        return AttentionMatch(node, operands, (packed[0], packed[1], packed[2]), merged, _takes_multi_head(operands, target))
    return AttentionMatch(node, operands, None, None)


def replace(graph: torch.fx.Graph, found: AttentionMatch) -> Replacements:
    node, op = found.anchor, found.operands
    with graph.inserting_before(node):
        if found.multi_head and found.projections is not None and found.merged is not None:
            fused = new_call(graph, torch.ops.fx2onnx.multi_head_attention.default,
                             (*found.projections, op.mask, op.scale, op.query_heads), node, like=node_value(found.merged))
            return [(found.merged, fused)]
        if found.projections is not None and found.merged is not None:
            # (B, S, heads * D) in and out: the heads' transposes and reshapes are the kernel's
            fused = new_call(graph, torch.ops.fx2onnx.attention_3d.default,
                             (*found.projections, op.mask, op.scale, op.is_causal, op.query_heads, op.key_heads),
                             node, like=node_value(found.merged))
            return [(found.merged, fused)]
        fused = new_call(graph, torch.ops.fx2onnx.attention.default,
                         (op.query, op.key, op.value, op.mask, op.scale, op.is_causal), node, like=node_value(node))
    return [(node, fused)]


RULE = FusionRule("attention", "Attention", _aten.scaled_dot_product_attention.default, FUSED_KERNELS_OPSET, True,
                  match, replace)
