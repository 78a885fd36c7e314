"""Attention over a KV cache as onnxruntime's ``GroupQueryAttention`` (a case of the
``attention`` rule of ``fused_kernels``): the cache's update moves into the kernel, which
writes the new tokens in place when the runtime gives past and present one buffer."""

from __future__ import annotations

import operator
from typing import Any

import torch

from fx2onnx.fx_passes import fused_ops  # noqa: F401 - registers torch.ops.fx2onnx.*
from fx2onnx.fx_passes.fusion_graph import (
    FUSED, NOT_THE_PATTERN, ONNXRUNTIME, FusionTarget, erase_unused_tree, heads_merge, is_heads_transpose, merged_heads,
    node_value, split_heads,
)

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


def _cache_lengths(graph: torch.fx.Graph, mask: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node]:
    """The int32 ``(seqlens_k, total_length)`` of ``mask`` (B, total): each sequence's
    tokens but one, and the mask's length. Made once, after the model's inputs."""
    made = [node for node in graph.nodes if node.meta.get("fx2onnx_cache_lengths")]
    if made:
        return made[0], made[1]
    mask_value = node_value(mask)
    first_step = next(node for node in graph.nodes if node.op != "placeholder")

    def add(target: Any, args: tuple[Any, ...], value: Any, **kwargs: Any) -> torch.fx.Node:
        new = graph.call_function(target, args, kwargs)
        new.meta["val"] = value
        return new

    with mask_value.fake_mode, graph.inserting_before(first_step):
        tokens = add(_aten.sum.dim_IntList, (mask, [1]), mask_value.sum(1))
        but_one = add(_aten.sub.Tensor, (tokens, 1), node_value(tokens) - 1)
        seqlens = add(_aten._to_copy.default, (but_one,), node_value(but_one).to(torch.int32), dtype=torch.int32)
        length = add(_aten.sym_size.int, (mask, 1), mask_value.shape[1])
        total = add(_aten.scalar_tensor.default, (length,), torch.scalar_tensor(mask_value.shape[1], dtype=torch.int32),
                    dtype=torch.int32)
    for node in (seqlens, total):
        node.meta["fx2onnx_cache_lengths"] = True
    return seqlens, total


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
    seqlens, total = _cache_lengths(graph, tokens)
    inputs = (*packed, caches[0][0], caches[1][0], seqlens, total, scale, query_heads, key_heads)
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
