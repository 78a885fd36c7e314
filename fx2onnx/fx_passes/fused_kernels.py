"""Fused kernels chosen on the FX graph, where the model's intent is still visible.

Pattern matchers on an ONNX graph have to guess attention from a dozen MatMul, Softmax
and Reshape nodes; here `aten.scaled_dot_product_attention` is still one node. Each rule
of :data:`RULES` replaces its anchor node by an fx2onnx operator (``torch.ops.fx2onnx.*``,
defined in ``fused_ops`` with PyTorch semantics), which the dispatcher translates to one
ONNX kernel. A node whose conditions do not hold stays as it is (translated unfused) and the
reason is recorded as a note.

- ``attention``: scaled-dot-product attention (causal, with a boolean or additive mask,
  with grouped-query heads) becomes the standard ``Attention`` (opset 23). The
  repetition of key and value heads that models write before it (transformers'
  ``repeat_kv``: unsqueeze, expand, reshape) is left to the kernel, which reads each
  key/value head for its group of query heads instead of copying the cache. Where the
  heads are split from (B, S, heads * D) projections just before and merged just after
  (encoders), the kernel takes and gives that layout, and the transposes go.
  Attention over a KV cache input the model appends the new tokens to, with a boolean
  mask built from the model input ``FusionTarget.causal_mask`` names, becomes
  onnxruntime's ``GroupQueryAttention`` when the target runtime is onnxruntime
  (``cached_attention``): the cache's update moves into the kernel, the mask's padding
  becomes its attention bias (``onnx_passes/cached_attention_guard`` adds the exact form
  for the steps onnxruntime's kernel refuses).
- ``rotary``: the rotary position embedding as models write it,
  ``x * cos + cat(-x2, x1) * sin`` with ``x1, x2`` the halves of the last dim and
  ``cos``/``sin`` tables whose two halves are equal by construction (computed from
  ``cat(freqs, freqs)``), becomes the standard ``RotaryEmbedding`` (opset 23). Partial
  rotations and interleaved pairs are left as written.
- ``gelu``: ``aten.gelu`` (exact or tanh) becomes the standard ``Gelu`` (opset 20)
  instead of its formula.
- ``rms_norm``: RMS normalization as models write it and as ``F.rms_norm`` decomposes,
  ``scale * (x * rsqrt(mean(x ** 2, dims) + eps))`` over trailing dims (the product
  possibly cast back from float32 first, the scale over those dims), becomes the standard
  ``RMSNormalization`` (opset 23), which computes in float32 and casts back as
  transformers' norms do (``F.rms_norm`` and ``nn.RMSNorm`` decompose to the same).

Each rule has the opset its kernel needs; below it the rule is skipped, with one note
for the rules whose anchor is their own operator (an ``add`` is not a rotation).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from diagnostics import DiagnosticContext, Level, rules
from fx2onnx.fx_passes import fused_ops  # noqa: F401 - registers torch.ops.fx2onnx.*
from fx2onnx.fx_passes.cached_attention import fuse_cached_attention
from fx2onnx.fx_passes.fusion_graph import (
    FLOATS_ORT_RUNS, FUSED, NOT_THE_PATTERN, FusedOtherwise, FusionTarget, arguments, erase_unused_tree, merged_heads,
    node_value, only_user, split_heads,
)
from fx2onnx.fx_passes.remove_identity_views import RESHAPES, same_size

_aten = torch.ops.aten

# The opset from which every rule applies (Attention and RotaryEmbedding are new in 23).
FUSED_KERNELS_OPSET = 23


@dataclass(frozen=True)
class FusionRule:
    """One fused kernel: the node it starts from, the opset its kernel needs, whether
    the anchor is the rule's own operator, and the rewrite, which returns
    :data:`FUSED`, :data:`NOT_THE_PATTERN`, or why the node stays unfused."""

    name: str
    anchor: Any
    opset: int
    whole_operator: bool
    rewrite: Callable[[torch.fx.Node, set[torch.fx.Node], FusionTarget], bool | str]  # (anchor, erased so far, target)


def _unrepeated_heads(node: torch.fx.Node) -> tuple[torch.fx.Node, int] | None:
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


def _to_the_end(end: Any) -> bool:
    """Whether a slice's end is past any size (None, or torch's 2**63 - 1)."""
    return end is None or (isinstance(end, int) and end >= 2**62)


def _keeps_size(size: Any, reference: Any) -> bool:
    """Whether an expand size (int, -1, or a node computing a symbolic size) keeps ``reference``."""
    size = node_value(size) if isinstance(size, torch.fx.Node) else size
    return size == -1 if isinstance(size, int) and size < 0 else same_size(size, reference)


def _fuse_attention(node: torch.fx.Node, erased: set[torch.fx.Node], target: FusionTarget) -> bool | str:
    args = arguments(node)
    query, key, value, mask = args["query"], args["key"], args["value"], args.get("attn_mask")
    if args.get("dropout_p", 0.0) != 0.0:
        return "dropout (ONNX Attention has none)"
    values = [node_value(x) for x in (query, key, value)]
    if any(v is None or v.dim() != 4 for v in values):
        return "query, key and value are not all 4-D"
    if values[0].dtype not in FLOATS_ORT_RUNS:
        return f"{values[0].dtype} (onnxruntime's Attention runs float32 and float16)"
    if mask is not None and (node_value(mask) is None or node_value(mask).dim() > 4):
        return "a mask of more than 4 dims"
    if mask is not None and node_value(mask).dtype not in (torch.bool, values[0].dtype):
        return f"a {node_value(mask).dtype} mask"
    if mask is not None and (node_value(mask).dim() < 2 or not same_size(node_value(mask).shape[-2], values[0].shape[-2])):
        return "a mask shared by every query (onnxruntime's Attention takes one row per query)"
    scale, head_size = args.get("scale"), values[0].shape[-1]
    if scale is None and not isinstance(head_size, int):
        return "a symbolic head size"
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(head_size)
    repeated = (key, value)
    unrepeated = [_unrepeated_heads(x) for x in repeated]
    if all(u is not None for u in unrepeated) and unrepeated[0][1] == unrepeated[1][1]:  # type: ignore[index]
        key, value = unrepeated[0][0], unrepeated[1][0]  # type: ignore[index]
    query_heads, key_heads = values[0].shape[1], node_value(key).shape[1]
    if not isinstance(query_heads, int) or not isinstance(key_heads, int) or query_heads % key_heads:
        return f"{query_heads} query heads for {key_heads} key heads"
    is_causal = bool(args.get("is_causal", False))
    cached = fuse_cached_attention(node, query, key, value, mask, scale, target, erased)
    if cached is FUSED:
        return FUSED
    graph = node.graph
    packed = [split_heads(x) for x in (query, key, value)]
    merged = merged_heads(node)
    if all(x is not None for x in packed) and merged is not None:
        # (B, S, heads * D) in and out: the heads' transposes and reshapes are the kernel's
        with graph.inserting_before(node):
            fused = graph.call_function(
                torch.ops.fx2onnx.attention_3d.default, (*packed, mask, scale, is_causal, query_heads, key_heads)
            )
        fused.meta.update({k: v for k, v in node.meta.items() if k != "val"})
        fused.meta["val"] = node_value(merged)
        merged.replace_all_uses_with(fused)
        erase_unused_tree(merged, erased, replaced=node)
        repeated = (query, key, value)
    else:
        with graph.inserting_before(node):
            fused = graph.call_function(torch.ops.fx2onnx.attention.default, (query, key, value, mask, scale, is_causal))
        fused.meta.update(node.meta)
        node.replace_all_uses_with(fused)
        graph.erase_node(node)
        erased.add(node)
    for chain_end in repeated:  # the repetition or head split, unless something else reads it
        erase_unused_tree(chain_end, erased)
    return FusedOtherwise(f"Attention, not GroupQueryAttention: {cached}") if isinstance(cached, str) else FUSED


# Elementwise steps that keep "the two halves of the last dim are equal".
_HALVES_KEEPING = {_aten.cos.default, _aten.sin.default, _aten._to_copy.default, _aten.to.dtype, _aten.clone.default,
                   _aten.alias.default, _aten.mul.Tensor, _aten.div.Tensor}


def _has_equal_halves(node: Any) -> bool:
    """Whether ``node``'s last dim is two equal halves: ``cat([f, f], -1)`` under steps
    that act on each element alike (cos, sin, casts, scaling by a number)."""
    while isinstance(node, torch.fx.Node) and node.target in _HALVES_KEEPING:
        if len(node.args) > 1 and not isinstance(node.args[1], (int, float)):
            return False  # scaled by a tensor: the halves may differ
        node = node.args[0]
    if not isinstance(node, torch.fx.Node) or node.target != _aten.cat.default:
        return False
    parts, dim = node.args[0], node.args[1] if len(node.args) > 1 else 0
    last = node_value(node).dim() - 1 if node_value(node) is not None else None
    return len(parts) == 2 and parts[0] is parts[1] and dim in (-1, last)


def _factors(node: Any) -> list[tuple[Any, Any]]:
    """``[(a, b), (b, a)]`` when ``node`` is ``a * b``."""
    if isinstance(node, torch.fx.Node) and node.target == _aten.mul.Tensor and len(node.args) == 2:
        return [tuple(node.args), tuple(reversed(node.args))]
    return []


def _slice_of_last_dim(node: Any, x: Any, start: int, end: int | None) -> bool:
    if not isinstance(node, torch.fx.Node) or node.target != _aten.slice.Tensor or node.args[0] is not x:
        return False
    args = arguments(node)
    stop_ok = args["end"] == end if end is not None else _to_the_end(args["end"])
    return args["dim"] in (-1, 3) and args["start"] == start and args["step"] == 1 and stop_ok


def _is_rotated_half(node: Any, x: Any, half: int) -> bool:
    """Whether ``node`` is ``cat([-x[..., half:], x[..., :half]], -1)``."""
    if not isinstance(node, torch.fx.Node) or node.target != _aten.cat.default or len(node.args[0]) != 2:
        return False
    negated, first = node.args[0]
    if node.args[1] not in (-1, 3) or not isinstance(negated, torch.fx.Node) or negated.target != _aten.neg.default:
        return False
    return _slice_of_last_dim(negated.args[0], x, half, None) and _slice_of_last_dim(first, x, 0, half)


def _table(node: Any) -> Any:
    """The (B, S, D) table of ``unsqueeze(table, 1)``, when its halves are equal."""
    if isinstance(node, torch.fx.Node) and node.target == _aten.unsqueeze.default and node.args[1] == 1:
        table = node.args[0]
        if node_value(table) is not None and node_value(table).dim() == 3 and _has_equal_halves(table):
            return table
    return None


def _fuse_rotary(node: torch.fx.Node, erased: set[torch.fx.Node], target: FusionTarget) -> bool | str:
    if len(node.args) != 2 or node.kwargs.get("alpha", 1) != 1:
        return NOT_THE_PATTERN
    for direct, rotated in (node.args, tuple(reversed(node.args))):
        for x, cos in _factors(direct):
            x_value = node_value(x)
            if x_value is None or x_value.dim() != 4 or not isinstance(x_value.shape[-1], int) or x_value.shape[-1] % 2:
                continue
            half = x_value.shape[-1] // 2
            for turned, sin in _factors(rotated):
                cos_table, sin_table = _table(cos), _table(sin)
                if _is_rotated_half(turned, x, half) and cos_table is not None and sin_table is not None:
                    if not all(same_size(node_value(t).shape[0], x_value.shape[0]) or same_size(node_value(t).shape[0], 1)
                               for t in (cos_table, sin_table)):
                        return "tables for another batch size"
                    if x_value.dtype not in FLOATS_ORT_RUNS:
                        return f"{x_value.dtype} (onnxruntime's RotaryEmbedding runs float32 and float16)"
                    _replace_by_rotary(node, x, cos_table, sin_table, half, erased)
                    return FUSED
    return NOT_THE_PATTERN


def _replace_by_rotary(
    node: torch.fx.Node, x: torch.fx.Node, cos: torch.fx.Node, sin: torch.fx.Node, half: int, erased: set[torch.fx.Node]
) -> None:
    graph, context = node.graph, {k: v for k, v in node.meta.items() if k != "val"}

    def add(target: Any, args: tuple[Any, ...], value: Any) -> torch.fx.Node:
        new = graph.call_function(target, args)
        new.meta.update(context)
        new.meta["val"] = value
        return new

    batch = node_value(x).shape[0]
    with graph.inserting_before(node):
        halves = []
        for table in (cos, sin):
            first_half = add(_aten.slice.Tensor, (table, -1, 0, half), _aten.slice.Tensor(node_value(table), -1, 0, half))
            if not same_size(node_value(table).shape[0], batch):
                # one table for every sequence (positions shared): the kernel wants one per sequence
                size = batch if isinstance(batch, int) else add(_aten.sym_size.int, (x, 0), batch)
                first_half = add(_aten.expand.default, (first_half, [size, -1, -1]), node_value(first_half).expand(batch, -1, -1))
            halves.append(first_half)
        fused = graph.call_function(torch.ops.fx2onnx.rotary.default, (x, *halves))
    fused.meta.update(node.meta)
    old_terms = list(node.args)
    node.replace_all_uses_with(fused)
    graph.erase_node(node)
    for term in old_terms:
        erase_unused_tree(term, erased)


def _fuse_gelu(node: torch.fx.Node, erased: set[torch.fx.Node], target: FusionTarget) -> bool | str:
    x, approximate = node.args[0], node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    if node_value(x) is None or node_value(x).dtype != torch.float32:
        return f"{getattr(node_value(x), 'dtype', 'unknown type')} (onnxruntime's Gelu runs float32 only)"
    graph = node.graph
    with graph.inserting_before(node):
        fused = graph.call_function(torch.ops.fx2onnx.gelu.default, (x, approximate))
    fused.meta.update(node.meta)
    node.replace_all_uses_with(fused)
    graph.erase_node(node)
    return FUSED


def _other_factor(product: Any, factor: torch.fx.Node) -> Any:
    """``b`` when ``product`` is ``factor * b`` or ``b * factor``, else None."""
    return next((other for one, other in _factors(product) if one is factor), None)


def _trailing_dims(dims: Any, rank: int) -> int | None:
    """k when ``dims`` are the last k of ``rank`` dims (in any spelling), else None."""
    wanted = sorted(d % rank for d in dims or ())
    return len(wanted) if wanted and wanted == list(range(rank - len(wanted), rank)) else None


def _mean_of_squares(node: Any) -> tuple[torch.fx.Node, float, int] | None:
    """``(x, eps, k)`` when ``node`` is ``mean(x ** 2, last k dims, keepdim) + eps``."""
    if not isinstance(node, torch.fx.Node) or node.target not in (_aten.add.Tensor, _aten.add.Scalar) or len(node.args) != 2:
        return None
    mean, eps = node.args if isinstance(node.args[1], float) else tuple(reversed(node.args))
    if not isinstance(eps, float) or not isinstance(mean, torch.fx.Node) or mean.target != _aten.mean.dim:
        return None
    averaged = arguments(mean)
    squared = averaged["self"]
    if not isinstance(squared, torch.fx.Node) or squared.target != _aten.pow.Tensor_Scalar or squared.args[1] != 2:
        return None
    x, x_value = squared.args[0], node_value(squared.args[0])
    if x_value is None or x_value.dim() == 0 or not averaged["keepdim"] or averaged["dtype"] is not None:
        return None
    trailing = _trailing_dims(averaged["dim"], x_value.dim())
    return (x, eps, trailing) if trailing is not None else None


def _fuse_rms_norm(node: torch.fx.Node, erased: set[torch.fx.Node], target: FusionTarget) -> bool | str:
    """Anchored at the ``rsqrt`` of a mean of squares plus eps, read once, by ``x * rsqrt``,
    whose result (cast back, maybe) is scaled by a tensor over the normalized dims."""
    found = _mean_of_squares(node.args[0])
    normalized = only_user(node)
    if found is None or normalized is None or _other_factor(normalized, found[0]) is not node:
        return NOT_THE_PATTERN
    x, eps, trailing = found
    scaled, result = normalized, only_user(normalized)
    if result is not None and _is_cast(result):
        scaled, result = result, only_user(result)  # cast back to the input's dtype before the scale
    scale = _other_factor(result, scaled) if result is not None else None
    scale_shape = list(node_value(scale).shape) if isinstance(scale, torch.fx.Node) and node_value(scale) is not None else None
    if scale_shape is None or len(scale_shape) != trailing or not all(map(same_size, scale_shape, node_value(x).shape[-trailing:])):
        return "no scale over the normalized dims follows the normalization"
    source = x.args[0] if _is_float32_upcast(x) else x  # the kernel computes in float32 itself
    cast_back = only_user(result)
    if _is_float32_upcast(scale) and cast_back is not None and _is_cast(cast_back) and node_value(cast_back).dtype == node_value(source).dtype:
        # torch's decomposition scales in float32 and casts after: the kernel casts before
        # (one rounding of the input's type more, within its precision)
        scale, result = scale.args[0], cast_back
    return _replace_by_rms_norm(result, source, scale, eps, trailing, erased)


def _is_cast(node: torch.fx.Node) -> bool:
    return node.target == _aten.type_as.default or (node.target == _aten._to_copy.default and set(node.kwargs) == {"dtype"})


def _is_float32_upcast(node: Any) -> bool:
    return (isinstance(node, torch.fx.Node) and node.target == _aten._to_copy.default and set(node.kwargs) == {"dtype"}
            and node.kwargs["dtype"] == torch.float32)


def _replace_by_rms_norm(result: torch.fx.Node, x: torch.fx.Node, scale: Any, eps: float, trailing_dims: int,
                         erased: set[torch.fx.Node]) -> bool | str:
    """``result`` replaced by the RMS normalization of ``x`` over its last ``trailing_dims``
    dims, scaled by ``scale``, when onnxruntime's kernel takes their types."""
    dtypes = {node_value(x).dtype, node_value(scale).dtype, node_value(result).dtype}
    if len(dtypes) != 1 or not dtypes <= set(FLOATS_ORT_RUNS):
        return (f"{node_value(x).dtype} input, {node_value(scale).dtype} scale (onnxruntime's RMSNormalization runs "
                "float32 and float16, input, scale and result alike)")
    graph = result.graph
    with graph.inserting_before(result):
        fused = graph.call_function(torch.ops.fx2onnx.rms_norm.default, (x, scale, eps, trailing_dims))
    fused.meta.update(result.meta)
    result.replace_all_uses_with(fused)
    erase_unused_tree(result, erased)
    return FUSED


RULES: tuple[FusionRule, ...] = (
    FusionRule("attention", _aten.scaled_dot_product_attention.default, FUSED_KERNELS_OPSET, True, _fuse_attention),
    FusionRule("rotary", _aten.add.Tensor, FUSED_KERNELS_OPSET, False, _fuse_rotary),
    FusionRule("gelu", _aten.gelu.default, 20, True, _fuse_gelu),
    FusionRule("rms_norm", _aten.rsqrt.default, FUSED_KERNELS_OPSET, False, _fuse_rms_norm),
)


def fuse_kernels(
    graph_module: torch.fx.GraphModule, opset: int, context: DiagnosticContext, opset_chosen: bool = True,
    target: FusionTarget = FusionTarget(),
) -> int:
    """Apply every rule of :data:`RULES` that ``opset`` has the kernel of to
    ``graph_module``, in place, for ``target``; returns how many nodes became fused
    kernels. When the user chose ``opset`` (``opset_chosen``), a note names the rules it
    is too old for."""
    by_anchor = {rule.anchor: rule for rule in RULES}
    graph = graph_module.graph
    matches = [node for node in graph.nodes if node.op == "call_function" and node.target in by_anchor]
    waiting = collections.Counter(
        rule for node in matches if (rule := by_anchor[node.target]).opset > opset and rule.whole_operator and opset_chosen
    )
    for rule, count in waiting.items():
        context.record(
            rules.FX_PASS, Level.NOTE, pass_name="fuse_kernels",
            message=f"{count} {rule.name} node(s) kept unfused: its fused kernel is an ONNX operator of opset {rule.opset}; "
            f"export with ExportOptions(opset_version={FUSED_KERNELS_OPSET}) to use it.",
        )
    fused, erased = 0, set()
    for node in matches:
        rule = by_anchor[node.target]
        if rule.opset > opset or node in erased:  # erased: a term of a rewrite before it
            continue
        reason = rule.rewrite(node, erased, target)
        fused += reason is FUSED or isinstance(reason, FusedOtherwise)
        if isinstance(reason, (str, FusedOtherwise)):
            said = f"fused as {reason.reason}" if isinstance(reason, FusedOtherwise) else f"kept unfused: {reason}"
            context.record(rules.FX_PASS, Level.NOTE, pass_name="fuse_kernels", message=f"`{node.name}` ({rule.name}) {said}.")
    if fused:
        graph_module.recompile()
    return fused
