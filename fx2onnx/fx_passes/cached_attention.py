"""Attention over a KV cache as onnxruntime's ``GroupQueryAttention`` (a case of the
``attention`` rule of ``fused_kernels``): the cache's update moves into the kernel, which
writes the new tokens in place when the runtime gives past and present one buffer, and the
mask's padding (left, right or anywhere) becomes the kernel's attention bias."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch

from fx2onnx.fx_passes import fused_ops  # noqa: F401 - registers torch.ops.fx2onnx.*
from fx2onnx.fx_passes.fusion_graph import (
    FUSED, NOT_THE_PATTERN, ONNXRUNTIME, FusionTarget, erase_unused_tree, heads_merge, is_heads_transpose, merged_heads,
    node_value, split_heads,
)
from fx2onnx.fx_passes.remove_identity_views import same_size

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


def _heads_side_by_side(node: Any, graph_target: torch.fx.Node) -> torch.fx.Node | None:
    """``node`` (B, heads, S, D) as a (B, S, heads * D) tensor: the projection it was split
    from, or its (B, S, heads, D) form (normalized per head, say) merged by a new view
    before ``graph_target``; None when ``node`` is no transpose of heads."""
    packed = split_heads(node)
    if packed is not None or not is_heads_transpose(node) or node_value(node.args[0]) is None:
        return packed
    per_head, graph = node.args[0], node.graph
    value = node_value(per_head)
    if value.dim() != 4 or not isinstance(value.shape[2], int) or not isinstance(value.shape[3], int):
        return None
    with graph.inserting_before(graph_target):
        sizes: list[Any] = []
        for dim, size in enumerate(value.shape[:2]):
            if not isinstance(size, int):  # a symbolic size, read from the tensor at run time
                size = graph.call_function(_aten.sym_size.int, (per_head, dim))
                size.meta["val"] = value.shape[dim]
            sizes.append(size)
        merged = graph.call_function(_aten.view.default, (per_head, [*sizes, value.shape[2] * value.shape[3]]))
    merged.meta.update({k: v for k, v in per_head.meta.items() if k != "val"})
    merged.meta["val"] = value.flatten(2)
    return merged


def _packed_heads(node: Any, heads: int, graph_target: torch.fx.Node) -> torch.fx.Node | None:
    """``node`` (B, heads, S, D) as a (B, S, heads * D) tensor (:func:`_heads_side_by_side`),
    its rotary embedding (if any) applied to that tensor instead (new nodes go before
    ``graph_target``); None when it is not of that form."""
    if isinstance(node, torch.fx.Node) and node.target == torch.ops.fx2onnx.rotary.default:
        packed = _heads_side_by_side(node.args[0], graph_target)
        if packed is None:
            return None
        with node.graph.inserting_before(graph_target):
            turned = node.graph.call_function(torch.ops.fx2onnx.rotary_3d.default, (packed, *node.args[1:3], heads))
        turned.meta.update({k: v for k, v in node.meta.items() if k != "val"})
        turned.meta["val"] = torch.empty_like(node_value(packed))
        return turned
    return _heads_side_by_side(node, graph_target)


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
        new = graph.call_function(target, args, kwargs)
        new.meta["val"] = value
        return new

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
            new = graph.call_function(_aten.sym_size.int, (query, 1))
            new.meta["val"] = query_value.shape[1]
        expanded = graph.call_function(_aten.expand.default, (inputs.key_bias, [inputs.batch, 1, new, inputs.length]))
        expanded.meta["val"] = bias_value.expand(bias_value.shape[0], 1, query_value.shape[1], bias_value.shape[3])
    expanded.meta["fx2onnx_cache_input"] = (query_value.dtype, "query_bias")
    return expanded


def fuse_cached_attention(
    node: torch.fx.Node, query: Any, key: Any, value: Any, mask: Any, scale: float, target: FusionTarget,
    erased: set[torch.fx.Node],
) -> bool | str:
    """Attention over a cache the model appends the new tokens to, as onnxruntime's
    ``GroupQueryAttention``: causal over the tokens of ``target.causal_mask``, the
    cache's update inside the kernel (in place when the runtime gives past and present
    one buffer). :data:`NOT_THE_PATTERN` where the target does not allow it; a reason
    where the attention is not of that form."""
    graph = node.graph
    tokens = next((n for n in graph.nodes if n.op == "placeholder" and n.name == target.causal_mask), None)
    if target.runtime != ONNXRUNTIME or tokens is None:
        return NOT_THE_PATTERN
    if mask is not None and node_value(mask).dtype != torch.bool:
        return "an additive mask (a bias beside the causal mask: the kernel has none)"
    caches = [_appended_cache(x) for x in (key, value)]
    if caches[0] is None or caches[1] is None:
        return "key and value are not a model input with the new tokens appended"
    query_heads, key_heads = node_value(query).shape[1], node_value(key).shape[1]
    merged = heads_merge(node)
    if merged is None:
        return "its heads are not merged back side by side"
    if len({node_value(x).shape[-1] for x in (query, key, value)}) != 1:
        return "query, key and value heads of different sizes"
    packed = [_packed_heads(query, query_heads, node), *(_packed_heads(new, key_heads, node) for _, new in caches)]
    if any(x is None for x in packed):
        for x in packed:
            erase_unused_tree(x, erased)  # a rotation made for it
        return "query, key or value not split from (B, S, heads * D) projections"
    cache_inputs = _cache_inputs(graph, tokens, node_value(query).dtype)
    bias = _query_bias(cache_inputs, packed[0], node)
    inputs = (*packed, caches[0][0], caches[1][0], cache_inputs.seqlens, cache_inputs.total, bias, scale, query_heads, key_heads)
    with node_value(query).fake_mode:
        results = torch.ops.fx2onnx.cached_attention.default(*(node_value(x) if isinstance(x, torch.fx.Node) else x for x in inputs))
    context = {k: v for k, v in node.meta.items() if k != "val"}
    with graph.inserting_before(node):
        fused = graph.call_function(torch.ops.fx2onnx.cached_attention.default, inputs)
        fused.meta.update(context)
        fused.meta["val"] = results
        parts = []
        for index, result in enumerate(results):
            part = graph.call_function(operator.getitem, (fused, index))
            part.meta.update(context)
            part.meta["val"] = result
            parts.append(part)
    if merged_heads(node) is merged:
        merged.replace_all_uses_with(parts[0])
    else:  # another shape of the same elements (B * S rows, say)
        with graph.inserting_before(merged):
            reshaped = graph.call_function(_aten.view.default, (parts[0], merged.args[1]))
        reshaped.meta.update(merged.meta)
        merged.replace_all_uses_with(reshaped)
    erase_unused_tree(merged, erased, replaced=node)  # the attention, its head repetitions and its mask with it
    for cache, present in zip((key, value), parts[1:]):
        cache.replace_all_uses_with(present)
        erase_unused_tree(cache, erased)
    return FUSED
