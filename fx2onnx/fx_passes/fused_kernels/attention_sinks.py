"""Attention with sinks over a KV cache as onnxruntime's ``GroupQueryAttention`` with ``head_sink``.

gpt-oss's attention (transformers' eager form) is no ``scaled_dot_product_attention``:
its scores ``q @ k^T * scale + mask`` get one more column per head, the head's sink
logit, before the softmax (the row's largest subtracted first), and the column is dropped
after it: the sink takes a share of each query's attention and weighs no value. That is
the kernel's ``head_sink`` input. Anchored at the softmax, the pattern is read back to the
operands an attention kernel takes (key and value heads unrepeated, the additive mask's
boolean form), and ``group_query_attention`` does the rest: the cache, the mask's padding
and a sliding layer's window (``local_window_size``) as for scaled-dot-product attention
(``onnx_passes/cached_attention_guard`` keeps the sinks in the exact form).
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import Any

import torch

from fx2onnx.fx_passes.fused_kernels import group_query_attention
from fx2onnx.fx_passes.fused_kernels.attention import AttentionOperands, unrepeated_heads
from fx2onnx.fx_passes.fused_kernels.matching import (
    FLOATS_ORT_RUNS, FUSED_KERNELS_OPSET, PRODUCTS, SUMS, FusionRule, FusionTarget, Refusal, arguments, node_value,
    only_user, operand_orders,
)
from fx2onnx.fx_passes.remove_identity_views import RESHAPES, same_size

_aten = torch.ops.aten
_LAST_DIM = (-1, 3)
# Steps between the softmax's kept columns and the product with the values that leave
# the probabilities as they are (dropout of p = 0 or outside training, casts to their dtype).
_SAME_PROBABILITIES = {_aten.dropout.default, _aten._to_copy.default, _aten.to.dtype, _aten.alias.default,
                       _aten.clone.default, _aten.contiguous.default}


@dataclass(frozen=True)
class _SinkAttention:
    """The parts of an attention with sinks: ``scores`` (the column the sinks join),
    ``column`` (the sinks expanded, B, heads, S, 1), ``sinks`` (heads,), ``kept``: the last
    node of the kept probabilities, ``output``: their product with the values."""

    scores: torch.fx.Node
    column: torch.fx.Node
    sinks: torch.fx.Node
    kept: torch.fx.Node
    output: torch.fx.Node


def _keeps_probabilities(node: torch.fx.Node) -> bool:
    if node.target == _aten.dropout.default:
        args = arguments(node)
        return args["p"] == 0.0 or not args["train"]
    if node.target in (_aten._to_copy.default, _aten.to.dtype):
        value, source = node_value(node), node_value(node.args[0])
        return value is not None and source is not None and value.dtype == source.dtype
    return node.target in _SAME_PROBABILITIES


def _without_last_column(node: Any) -> bool:
    """Whether ``node`` is ``x[..., :-1]``."""
    if not isinstance(node, torch.fx.Node) or node.target != _aten.slice.Tensor:
        return False
    args = arguments(node)
    return args["dim"] in _LAST_DIM and args["start"] in (0, None) and args["end"] == -1 and args["step"] == 1


def _logits(node: Any) -> Any:
    """The logits of a softmax's input ``x - max(x, -1, keepdim)`` (or ``x`` itself)."""
    if isinstance(node, torch.fx.Node) and node.target == _aten.sub.Tensor and isinstance(node.args[1], torch.fx.Node):
        largest = node.args[1]
        if largest.target == _aten.amax.default and largest.args[0] is node.args[0]:
            return node.args[0]
        if largest.target == operator.getitem and largest.args[1] == 0:
            maximum = largest.args[0]
            if isinstance(maximum, torch.fx.Node) and maximum.target == _aten.max.dim and maximum.args[0] is node.args[0]:
                return node.args[0]
    return node


def _head_sinks(column: Any, scores: torch.fx.Node) -> torch.fx.Node | None:
    """The (heads,) sinks when ``column`` is ``expand(reshape(sinks, [1, heads, 1, 1]), [B, heads, S, 1])``
    beside ``scores`` (B, heads, S, T)."""
    if not isinstance(column, torch.fx.Node) or column.target != _aten.expand.default:
        return None
    shaped, value, scores_value = column.args[0], node_value(column), node_value(scores)
    if not isinstance(shaped, torch.fx.Node) or shaped.target not in RESHAPES or value is None or scores_value is None:
        return None
    sinks, heads = shaped.args[0], scores_value.shape[1]
    sinks_value, shaped_value = node_value(sinks), node_value(shaped)
    if sinks_value is None or sinks_value.dim() != 1 or not same_size(sinks_value.shape[0], heads):
        return None
    if list(shaped_value.shape) != [1, heads, 1, 1] or value.shape[3] != 1:
        return None
    if not all(same_size(value.shape[i], scores_value.shape[i]) for i in range(3)):
        return None
    return sinks


def _sink_attention(softmax: torch.fx.Node) -> _SinkAttention | None:
    """The attention with sinks whose softmax is ``softmax``, if it is one."""
    args = arguments(softmax)
    if args["dim"] not in _LAST_DIM:
        return None
    joined = _logits(args["self"])
    if not isinstance(joined, torch.fx.Node) or joined.target != _aten.cat.default or len(joined.args[0]) != 2:
        return None
    if (joined.args[1] if len(joined.args) > 1 else 0) not in _LAST_DIM:
        return None
    scores, column = joined.args[0]
    sinks = _head_sinks(column, scores)
    kept = only_user(softmax)
    if sinks is None or not _without_last_column(kept):
        return None
    while (user := only_user(kept)) is not None and _keeps_probabilities(user):
        kept = user
    output = only_user(kept)
    if output is None or output.target != _aten.matmul.default or output.args[0] is not kept:
        return None
    return _SinkAttention(scores, column, sinks, kept, output)


def _boolean_mask(additive: Any) -> torch.fx.Node | None:
    """``b`` when ``additive`` is ``(~b).to(dtype) * lowest``, the bias of the boolean mask
    ``b`` (0 where held, the dtype's lowest elsewhere: transformers' eager masks)."""
    value = node_value(additive) if isinstance(additive, torch.fx.Node) else None
    if value is None or not value.dtype.is_floating_point:
        return None
    for cast, factor in operand_orders(additive, PRODUCTS):
        if factor != torch.finfo(value.dtype).min or not isinstance(cast, torch.fx.Node) or cast.target != _aten._to_copy.default:
            continue
        negated = cast.args[0]
        if isinstance(negated, torch.fx.Node) and negated.target == _aten.bitwise_not.default:
            held = negated.args[0]
            if node_value(held) is not None and node_value(held).dtype == torch.bool:
                return held
    return None


def _scaled_product(scores: Any) -> tuple[torch.fx.Node, torch.fx.Node, float, Any] | Refusal | None:
    """``(query, repeated keys, scale, mask)`` of ``scores = q @ k^T * scale (+ mask)``."""
    product, mask = scores, None
    for term, other in operand_orders(scores, SUMS):
        if isinstance(term, torch.fx.Node) and term.target == _aten.mul.Tensor:
            product, mask = term, other
            break
    for matmul, scale in operand_orders(product, PRODUCTS):
        if not isinstance(scale, float) or not isinstance(matmul, torch.fx.Node) or matmul.target != _aten.matmul.default:
            continue
        query, transposed = matmul.args
        if not isinstance(transposed, torch.fx.Node) or transposed.target != _aten.transpose.int \
                or sorted(d % 4 for d in transposed.args[1:3]) != [2, 3]:
            return None
        return query, transposed.args[0], scale, mask
    return None


def _unrepeated(key: torch.fx.Node, value: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node]:
    """Key and value with transformers' ``repeat_kv`` of both undone (the kernel repeats)."""
    unrepeated = [unrepeated_heads(x) for x in (key, value)]
    if unrepeated[0] is not None and unrepeated[1] is not None and unrepeated[0][1] == unrepeated[1][1]:
        return unrepeated[0][0], unrepeated[1][0]
    return key, value


def _operands(found: _SinkAttention) -> AttentionOperands | Refusal | None:
    """What the kernel takes of an attention with sinks, or why it cannot."""
    product = _scaled_product(found.scores)
    if product is None:
        return None
    query, repeated_key, scale, additive = product
    if additive is None:
        return Refusal("attention with sinks without a mask")
    mask = _boolean_mask(additive)
    if mask is None:
        return Refusal("attention with sinks whose mask is no boolean mask's bias (0 held, the dtype's lowest elsewhere)")
    key, value = _unrepeated(repeated_key, found.output.args[1])
    values = [node_value(x) for x in (query, key, value)]
    if any(v is None or v.dim() != 4 for v in values):
        return Refusal("query, key and value are not all 4-D")
    if values[0].dtype not in FLOATS_ORT_RUNS:
        return Refusal(f"{values[0].dtype} (onnxruntime's GroupQueryAttention runs float32 and float16)")
    query_heads, key_heads = values[0].shape[1], values[1].shape[1]
    if not isinstance(query_heads, int) or not isinstance(key_heads, int) or query_heads % key_heads \
            or values[2].shape[1] != key_heads:
        return Refusal(f"{query_heads} query heads for {key_heads} key heads")
    return AttentionOperands(query, key, value, mask, scale, False, query_heads, key_heads)


def match(node: torch.fx.Node, target: FusionTarget) -> group_query_attention.GroupQueryAttentionMatch | Refusal | None:
    """Attention with sinks over a cache, anchored at its softmax; None where the target
    does not allow the kernel or the softmax is no attention with sinks."""
    tokens = group_query_attention.causal_mask_tokens(node, target)
    found = _sink_attention(node) if tokens is not None else None
    if found is None:
        return None
    operands = _operands(found)
    if not isinstance(operands, AttentionOperands):
        return operands
    matched = group_query_attention.match_operands(found.output, operands, tokens)
    if isinstance(matched, Refusal):
        return matched
    # the kernel goes in before the kept probabilities' last step, which the driver
    # erases with the rest (a dropout, which torch calls impure, among them)
    return dataclasses.replace(matched, anchor=found.kept, sinks=found.sinks)


RULE = FusionRule("group_query_attention_sinks", "GroupQueryAttention", _aten.softmax.int, FUSED_KERNELS_OPSET, False,
                  match, group_query_attention.replace)
