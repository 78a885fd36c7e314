"""Attention over a KV cache as onnxruntime's ``GroupQueryAttention``.

Scaled-dot-product attention over a cache input the model appends the new tokens to, with
a boolean mask built from the model input ``FusionTarget.causal_mask`` names, when the
target runtime is onnxruntime: the cache's update moves into the kernel, which writes the
new tokens in place when the runtime gives past and present one buffer, and the mask's
padding (left, right or anywhere) becomes the kernel's attention bias
(``onnx_passes/cached_attention_guard`` adds the exact form for the steps onnxruntime's
kernel refuses). A sliding layer's mask (a window of held tokens, ``window_mask``) gives
the kernel its window, ``local_window_size``. The rule comes before ``attention`` in the
table: where it refuses, the standard ``Attention`` takes the node, with a note saying why.
``attention_sinks`` reads attention with sinks into the same match (:func:`match_operands`)
and adds the sinks, the kernel's ``head_sink``.

``PACKED_OPERANDS_RULE`` takes a kernel a model calls itself (``torch.ops.fx2onnx.cached_attention``
given its heads put side by side, ``x.transpose(1, 2).flatten(2)``, after a per-head norm
and rotation) and gives it the packed forms this rule makes: the rotation on the packed
tensor, the norm on (B, S, heads, D), no transposes.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch

from fx2onnx.fx_passes.fused_kernels import operators  # noqa: F401 - registers torch.ops.fx2onnx.*
from fx2onnx.fx_passes.fused_kernels.attention import AttentionOperands, attention_operands
from fx2onnx.fx_passes.fused_kernels.editing import new_call
from fx2onnx.fx_passes.fused_kernels.matching import (
    COPIES, FUSED_KERNELS_OPSET, ONNXRUNTIME, FusionRule, FusionTarget, Match, Refusal, Replacements, heads_merge,
    is_heads_transpose, merged_heads, node_value, split_heads,
)
from fx2onnx.fx_passes.fused_kernels.window_mask import held_token_window
from fx2onnx.fx_passes.remove_identity_views import RESHAPES, same_size

_aten = torch.ops.aten


def _appended_cache(node: Any) -> tuple[torch.fx.Node, Any] | None:
    """``(past, new)`` when ``node`` is ``cat([past, new], dim=2)`` with ``past`` a 4-D
    model input (a KV cache that grows by the new tokens)."""
    if not isinstance(node, torch.fx.Node) or node.target != _aten.cat.default or len(node.args[0]) != 2:
        return None
    (past, new), dim = node.args[0], node.args[1] if len(node.args) > 1 else 0
    if not isinstance(past, torch.fx.Node) or past.op != "placeholder" or node_value(past) is None or node_value(past).dim() != 4:
        return None
    return (past, new) if dim in (2, -2) else None


@dataclass(frozen=True)
class _PackedHeads:
    """How an operand (B, heads, S, D) is had as (B, S, heads * D): the ``projection`` it
    is split from, or its (B, S, heads, D) form ``per_head`` (normalized per head, say) to
    merge by a new view; ``rotary``: the rotary embedding applied to it, applied to the
    packed tensor instead."""

    projection: torch.fx.Node | None
    per_head: torch.fx.Node | None
    rotary: torch.fx.Node | None = None
    norm: torch.fx.Node | None = None  # an RMS norm over each head, applied to ``per_head`` first


def _normalized_after_split(node: Any) -> _PackedHeads | None:
    """``node`` as an RMS norm over each head applied after the heads were split from a
    projection (Gemma 3's query and key norms), maybe cast to its own dtype: the norm
    over the head's last dim is the same before the transpose, on (B, S, heads, D)."""
    if isinstance(node, torch.fx.Node) and node.target == _aten.type_as.default and node_value(node) is not None \
            and node_value(node.args[0]) is not None and node_value(node).dtype == node_value(node.args[0]).dtype:
        node = node.args[0]
    if not isinstance(node, torch.fx.Node) or node.target != torch.ops.fx2onnx.rms_norm.default or node.args[3] != 1:
        return None
    split = node.args[0]
    if split_heads(split) is None:
        return None
    return _PackedHeads(None, split.args[0], norm=node)


def _heads_side_by_side(node: Any) -> _PackedHeads | None:
    packed = split_heads(node)
    if packed is not None:
        return _PackedHeads(packed, None)
    normalized = _normalized_after_split(node)
    if normalized is not None:
        return normalized
    if not is_heads_transpose(node) or node_value(node.args[0]) is None:
        return None
    value = node_value(node.args[0])
    if value.dim() != 4 or not isinstance(value.shape[2], int) or not isinstance(value.shape[3], int):
        return None
    return _PackedHeads(None, node.args[0])


def _packed_heads(node: Any) -> _PackedHeads | None:
    """``node`` (B, heads, S, D), maybe rotated, as a (B, S, heads * D) tensor; None when
    it is not of that form."""
    if isinstance(node, torch.fx.Node) and node.target == torch.ops.fx2onnx.rotary.default:
        inner = _heads_side_by_side(node.args[0])
        return None if inner is None else _PackedHeads(inner.projection, inner.per_head, node, inner.norm)
    return _heads_side_by_side(node)


@dataclass(frozen=True)
class GroupQueryAttentionMatch(Match):
    operands: AttentionOperands
    tokens: torch.fx.Node  # the causal mask's input
    caches: tuple[tuple[torch.fx.Node, Any], tuple[torch.fx.Node, Any]]  # (past, new) of key and value
    merged: torch.fx.Node  # the reshape of the result's heads side by side
    merged_exactly: bool  # into (B, S, heads * D) itself, not another shape of the same elements
    packed: tuple[_PackedHeads, _PackedHeads, _PackedHeads]  # query, new key, new value
    window: int | None = None  # a sliding layer's window, in held tokens (window_mask.py)
    sinks: torch.fx.Node | None = None  # each query head's sink logit (attention_sinks.py)


def causal_mask_tokens(node: torch.fx.Node, target: FusionTarget) -> torch.fx.Node | None:
    """The placeholder of ``target.causal_mask`` in ``node``'s graph when the target
    allows the kernel (onnxruntime, the masks built from that input), else None."""
    tokens = next((n for n in node.graph.nodes if n.op == "placeholder" and n.name == target.causal_mask), None)
    return tokens if target.runtime == ONNXRUNTIME else None


def match(node: torch.fx.Node, target: FusionTarget) -> GroupQueryAttentionMatch | Refusal | None:
    """Attention over a cache the model appends the new tokens to, causal over the tokens
    of ``target.causal_mask``; None where the target does not allow the kernel or the
    node is no attention a kernel takes (the ``attention`` rule says why)."""
    tokens = causal_mask_tokens(node, target)
    if tokens is None:
        return None
    operands = attention_operands(node)
    if isinstance(operands, Refusal):
        return None
    return match_operands(node, operands, tokens)


def match_operands(node: torch.fx.Node, operands: AttentionOperands, tokens: torch.fx.Node) -> GroupQueryAttentionMatch | Refusal:
    """The kernel's match of the attention ``node`` (its result, B, heads, S, D) of
    ``operands``, with masks built from ``tokens``, or why the kernel cannot take it."""
    if operands.mask is not None and node_value(operands.mask).dtype != torch.bool:
        return Refusal("an additive mask (a bias beside the causal mask: the kernel has none)")
    window = held_token_window(operands.mask, tokens)
    if isinstance(window, Refusal):
        return window
    key_cache, value_cache = _appended_cache(operands.key), _appended_cache(operands.value)
    if key_cache is None or value_cache is None:
        return Refusal("key and value are not a model input with the new tokens appended")
    merged = heads_merge(node)
    if merged is None:
        return Refusal("its heads are not merged back side by side")
    if len({node_value(x).shape[-1] for x in (operands.query, operands.key, operands.value)}) != 1:
        return Refusal("query, key and value heads of different sizes")
    packed = [_packed_heads(operands.query), _packed_heads(key_cache[1]), _packed_heads(value_cache[1])]
    if packed[0] is None or packed[1] is None or packed[2] is None:
        return Refusal("query, key or value not split from (B, S, heads * D) projections")
    return GroupQueryAttentionMatch(node, operands, tokens, (key_cache, value_cache), merged, merged_heads(node) is merged,
                                    (packed[0], packed[1], packed[2]), window)


def _split_sizes(per_head: torch.fx.Node) -> list[Any] | None:
    """The (B, S) sizes of the reshape that split ``per_head``'s (B, S, heads, D) from a
    projection (a norm over each head between), as that reshape was given them: every
    layer's merge then reads the same sizes (one shape computation in the ONNX graph)."""
    split = per_head
    while split.target == torch.ops.fx2onnx.rms_norm.default:
        split = split.args[0]
    target = split.args[1] if split.target in RESHAPES and len(split.args) > 1 else None
    if not isinstance(target, (list, tuple)) or len(target) != 4:
        return None
    sizes = list(target[:2])
    known = [node_value(size) if isinstance(size, torch.fx.Node) else size for size in sizes]
    return sizes if all(map(same_size, known, node_value(per_head).shape[:2])) else None


def _make_packed(graph: torch.fx.Graph, packed: _PackedHeads, heads: int) -> torch.fx.Node:
    """The (B, S, heads * D) tensor :class:`_PackedHeads` describes, made at the insertion point."""
    result = packed.projection
    if result is None:
        per_head = packed.per_head
        if packed.norm is not None:
            per_head = new_call(graph, torch.ops.fx2onnx.rms_norm.default, (per_head, *packed.norm.args[1:]), packed.norm,
                                like=node_value(per_head))
        value = node_value(per_head)
        sizes = _split_sizes(per_head)
        if sizes is None:
            sizes = []
            for dim, size in enumerate(value.shape[:2]):
                if not isinstance(size, int):  # a symbolic size, read from the tensor at run time
                    size = new_call(graph, _aten.sym_size.int, (per_head, dim), None, like=value.shape[dim])
                sizes.append(size)
        result = new_call(graph, _aten.view.default, (per_head, [*sizes, value.shape[2] * value.shape[3]]), per_head,
                          like=value.flatten(2))
    if packed.rotary is None:
        return result
    interleaved = packed.rotary.args[3] if len(packed.rotary.args) > 3 else False
    return new_call(graph, torch.ops.fx2onnx.rotary_3d.default, (result, *packed.rotary.args[1:3], heads, interleaved),
                    packed.rotary, like=node_value(result))


@dataclass(frozen=True)
class _CacheInputs:
    """What every layer's kernel reads of the mask (B, total): its sizes, ``seqlens_k``
    (total - 1 for every sequence: the new tokens go at the end of the mask, where
    transformers puts them, whatever the padding) and ``total_length`` (int32), and the
    bias of its tokens (0 where held, the dtype's lowest where padding; B, 1, 1, total)."""

    batch: Any  # an int, or the node of a symbolic size
    length: Any
    seqlens: torch.fx.Node
    total: torch.fx.Node
    key_bias: torch.fx.Node


def _cache_inputs(graph: torch.fx.Graph, mask: torch.fx.Node, dtype: torch.dtype) -> _CacheInputs:
    """The :class:`_CacheInputs` of ``mask`` for scores of ``dtype``, made once, after the
    model's inputs.

    The kernel appends each sequence's new tokens after its ``seqlens_k + 1 - S`` first
    cached ones; a length per sequence taken from the mask (the tokens it holds) puts them,
    and the attention's window, in the wrong place when the padding is on the left. The
    mask's full length puts them where the model does, and the bias masks the padding, so
    the kernel computes the model's attention for every mask."""
    mask_value = node_value(mask)
    made = {node.meta["fx2onnx_cache_input"][1]: node for node in graph.nodes
            if node.meta.get("fx2onnx_cache_input", (None,))[0] == dtype}
    if made:
        sizes = [made.get(role, mask_value.shape[dim]) for dim, role in enumerate(("batch", "length"))]
        return _CacheInputs(*sizes, made["seqlens"], made["total"], made["key_bias"])
    first_step = next(node for node in graph.nodes if node.op != "placeholder")

    def add(target: Any, args: tuple[Any, ...], value: Any, **kwargs: Any) -> torch.fx.Node:
        return new_call(graph, target, args, None, like=value, **kwargs)  # no source: every layer's

    def size(dim: int) -> Any:
        known = mask_value.shape[dim]
        return known if isinstance(known, int) else add(_aten.sym_size.int, (mask, dim), known)

    with mask_value.fake_mode, graph.inserting_before(first_step):
        batch, length = size(0), size(1)
        total = add(_aten.scalar_tensor.default, (length,), torch.scalar_tensor(mask_value.shape[1], dtype=torch.int32),
                    dtype=torch.int32)
        but_one = add(_aten.sub.Tensor, (total, 1), node_value(total) - 1)
        seqlens = add(_aten.expand.default, (but_one, [batch]), node_value(but_one).expand(mask_value.shape[0]))
        held = add(_aten._to_copy.default, (mask,), mask_value.to(torch.bool), dtype=torch.bool)  # nonzero: held
        # 0 held, the lowest number for padding, not -inf: a query that sees only padding
        # (a left-padded prompt's first positions) then averages instead of making NaN,
        # which the next layer's keys would carry to every held token (0 * NaN)
        zero, lowest = (add(_aten.scalar_tensor.default, (value,), torch.scalar_tensor(value, dtype=dtype), dtype=dtype)
                        for value in (0.0, torch.finfo(dtype).min))
        bias = add(_aten.where.self, (held, zero, lowest), torch.where(node_value(held), node_value(zero), node_value(lowest)))
        for _ in range(2):
            bias = add(_aten.unsqueeze.default, (bias, 1), node_value(bias).unsqueeze(1))
    made_inputs = _CacheInputs(batch, length, seqlens, total, bias)
    for role, node in vars(made_inputs).items():
        if isinstance(node, torch.fx.Node):
            node.meta["fx2onnx_cache_input"] = (dtype, role)
    return made_inputs


def _query_bias(inputs: _CacheInputs, query: torch.fx.Node, before: torch.fx.Node) -> torch.fx.Node:
    """The mask's bias for each of ``query``'s (B, S, ...) tokens (B, 1, S, total): the
    kernel takes a row per query. Made once, before the first layer's attention (every
    layer has the same new tokens), so that a decode step expands it once."""
    graph, query_value = before.graph, node_value(query)
    made = next((node for node in inputs.key_bias.users if node.meta.get("fx2onnx_cache_input") == (query_value.dtype, "query_bias")
                 and same_size(node_value(node).shape[2], query_value.shape[1])), None)
    if made is not None:
        return made
    bias_value = node_value(inputs.key_bias)
    with bias_value.fake_mode, graph.inserting_before(before):
        new = query_value.shape[1]
        if not isinstance(new, int):
            new = new_call(graph, _aten.sym_size.int, (query, 1), None, like=query_value.shape[1])
        expanded = new_call(graph, _aten.expand.default, (inputs.key_bias, [inputs.batch, 1, new, inputs.length]), None,
                            like=bias_value.expand(bias_value.shape[0], 1, query_value.shape[1], bias_value.shape[3]))
    expanded.meta["fx2onnx_cache_input"] = (query_value.dtype, "query_bias")
    return expanded


def _window_argument(found: GroupQueryAttentionMatch) -> tuple[int, ...]:
    """The kernel's ``window`` argument: a sliding layer's window, none for a full layer."""
    return () if found.window is None else (found.window,)


def replace(graph: torch.fx.Graph, found: GroupQueryAttentionMatch) -> Replacements:
    """The kernel before the attention, reading the projections, the caches and the mask's
    inputs; its outputs take over the merged result and the grown caches (in place when
    the runtime gives past and present one buffer)."""
    node, op = found.anchor, found.operands
    with graph.inserting_before(node):
        packed = [_make_packed(graph, x, heads)
                  for x, heads in zip(found.packed, (op.query_heads, op.key_heads, op.key_heads))]
    cache_inputs = _cache_inputs(graph, found.tokens, node_value(op.query).dtype)
    bias = _query_bias(cache_inputs, packed[0], node)
    (past_key, _), (past_value, _) = found.caches
    inputs = (*packed, past_key, past_value, cache_inputs.seqlens, cache_inputs.total, bias, op.scale, op.query_heads,
              op.key_heads, *_window_argument(found))
    sinks = {} if found.sinks is None else {"sinks": found.sinks}
    with graph.inserting_before(node):
        fused = new_call(graph, torch.ops.fx2onnx.cached_attention.default, inputs, node, **sinks)
        parts = [new_call(graph, operator.getitem, (fused, index), node, like=result)
                 for index, result in enumerate(node_value(fused))]
    result = parts[0]
    if not found.merged_exactly:  # another shape of the same elements (B * S rows, say)
        with graph.inserting_before(found.merged):
            result = new_call(graph, _aten.view.default, (parts[0], found.merged.args[1]), found.merged,
                              like=node_value(found.merged))
    # the attention goes with the merged result (its head repetitions and its mask with it)
    return [(found.merged, result), (op.key, parts[1]), (op.value, parts[2])]


RULE = FusionRule("group_query_attention", "GroupQueryAttention", _aten.scaled_dot_product_attention.default,
                  FUSED_KERNELS_OPSET, False, match, replace)


def _heads_put_side_by_side(node: Any) -> torch.fx.Node | None:
    """``x`` (B, heads, S, D) when ``node`` is ``transpose(x, 1, 2)`` (copies between)
    flattened or reshaped into (B, S, heads * D)."""
    value = node_value(node) if isinstance(node, torch.fx.Node) else None
    if value is None or value.dim() != 3:
        return None
    if node.target == _aten.flatten.using_ints:
        if node.args[1:] not in ((2,), (2, -1), (2, 3)):
            return None
    elif node.target not in RESHAPES:
        return None
    source = node.args[0]
    while isinstance(source, torch.fx.Node) and source.target in COPIES:
        source = source.args[0]
    if not is_heads_transpose(source) or node_value(source.args[0]) is None:
        return None
    split = node_value(source.args[0])
    if split.dim() != 4 or not isinstance(split.shape[1], int) or not isinstance(split.shape[3], int):
        return None
    same = same_size(value.shape[0], split.shape[0]) and same_size(value.shape[1], split.shape[2])
    return source.args[0] if same and same_size(value.shape[2], split.shape[1] * split.shape[3]) else None


@dataclass(frozen=True)
class PackedOperandsMatch(Match):
    operands: tuple[tuple[int, torch.fx.Node, _PackedHeads, int], ...]  # (argument index, its node, packed form, heads)


def match_packed_operands(node: torch.fx.Node, target: FusionTarget) -> PackedOperandsMatch | None:
    """The query, key and value of the kernel ``node`` that are (B, heads, S, D) tensors
    of a packed form (:func:`_packed_heads`) put side by side again."""
    found = []
    for index in range(3):
        merged = node.args[index]
        split = _heads_put_side_by_side(merged)
        packed = _packed_heads(split) if split is not None else None
        if packed is not None:
            found.append((index, merged, packed, int(node_value(split).shape[1])))
    return PackedOperandsMatch(node, tuple(found)) if found else None


def replace_packed_operands(graph: torch.fx.Graph, found: PackedOperandsMatch) -> Replacements:
    """The packed forms in place of the merged operands (the same values)."""
    replacements = []
    for _, merged, packed, heads in found.operands:
        with graph.inserting_before(found.anchor):
            replacements.append((merged, _make_packed(graph, packed, heads)))
    return replacements


PACKED_OPERANDS_RULE = FusionRule("packed_attention_operands", "GroupQueryAttention", torch.ops.fx2onnx.cached_attention.default,
                                  FUSED_KERNELS_OPSET, False, match_packed_operands, replace_packed_operands)
