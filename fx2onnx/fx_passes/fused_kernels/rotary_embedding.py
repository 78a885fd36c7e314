"""The rotary position embedding as the standard ``RotaryEmbedding`` (opset 23).

As models write it, ``x * cos + cat(-x2, x1) * sin`` with ``x1, x2`` the halves of the
last dim and ``cos``/``sin`` tables whose two halves are equal by construction (computed
from ``cat(freqs, freqs)``), or as gpt-oss writes it, ``cat(x1 cos - x2 sin, x2 cos + x1 sin)``
with half tables (``HALVES_RULE``), or as Cohere writes it, the pairs ``(x[2i], x[2i+1])``
rotated, ``x * cos + flatten(stack([-x[..., 1::2], x[..., ::2]], -1)) * sin`` with tables whose
pairs are equal (``repeat_interleave(freqs, 2, -1)``), as the kernel's ``interleaved=1``
(``INTERLEAVED_RULE``). Partial rotations are left as written.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch

from fx2onnx.fx_passes.fused_kernels import operators  # noqa: F401 - registers torch.ops.fx2onnx.*
from fx2onnx.fx_passes.fused_kernels.editing import new_call
from fx2onnx.fx_passes.fused_kernels.matching import (
    FLOATS_ORT_RUNS, FUSED_KERNELS_OPSET, PRODUCTS, FusionRule, FusionTarget, Match, Refusal, Replacements, arguments,
    node_value, operand_orders,
)
from fx2onnx.fx_passes.remove_identity_views import same_size

_aten = torch.ops.aten

# Elementwise steps that keep "the two halves of the last dim are equal".
_HALVES_KEEPING = {_aten.cos.default, _aten.sin.default, _aten._to_copy.default, _aten.to.dtype, _aten.clone.default,
                   _aten.alias.default, _aten.mul.Tensor, _aten.div.Tensor}


def _before_elementwise_steps(node: Any) -> Any:
    """``node`` under the steps that act on each element alike (cos, sin, casts, scaling by
    a number); None when a step scales by a tensor (which may differ element by element)."""
    while isinstance(node, torch.fx.Node) and node.target in _HALVES_KEEPING:
        if len(node.args) > 1 and not isinstance(node.args[1], (int, float)):
            return None
        node = node.args[0]
    return node if isinstance(node, torch.fx.Node) else None


def _along_last_dim(node: torch.fx.Node, dim: Any) -> bool:
    return dim == -1 or (isinstance(node_value(node), torch.Tensor) and dim == node_value(node).dim() - 1)


def _has_equal_halves(node: Any) -> bool:
    """Whether ``node``'s last dim is two equal halves: ``cat([f, f], -1)`` under elementwise steps."""
    node = _before_elementwise_steps(node)
    if node is None or node.target != _aten.cat.default:
        return False
    parts, dim = node.args[0], node.args[1] if len(node.args) > 1 else 0
    return len(parts) == 2 and parts[0] is parts[1] and _along_last_dim(node, dim)


def _has_equal_pairs(node: Any) -> bool:
    """Whether ``node``'s last dim is pairs of equal entries: ``repeat_interleave(f, 2, -1)``
    under elementwise steps."""
    node = _before_elementwise_steps(node)
    if node is None or node.target != _aten.repeat_interleave.self_int or len(node.args) < 3:
        return False
    return node.args[1] == 2 and _along_last_dim(node, node.args[2])


def _to_the_end(end: Any) -> bool:
    """Whether a slice's end is past any size (None, or torch's 2**63 - 1)."""
    return end is None or (isinstance(end, int) and end >= 2**62)


def _slice_of_last_dim(node: Any, x: Any, start: int, end: int | None, step: int = 1) -> bool:
    if not isinstance(node, torch.fx.Node) or node.target != _aten.slice.Tensor or node.args[0] is not x:
        return False
    args = arguments(node)
    stop_ok = args["end"] == end if end is not None else _to_the_end(args["end"])
    return args["dim"] in (-1, 3) and args["start"] == start and args["step"] == step and stop_ok


def _is_rotated_half(node: Any, x: Any, half: int) -> bool:
    """Whether ``node`` is ``cat([-x[..., half:], x[..., :half]], -1)``."""
    if not isinstance(node, torch.fx.Node) or node.target != _aten.cat.default or len(node.args[0]) != 2:
        return False
    negated, first = node.args[0]
    if node.args[1] not in (-1, 3) or not isinstance(negated, torch.fx.Node) or negated.target != _aten.neg.default:
        return False
    return _slice_of_last_dim(negated.args[0], x, half, None) and _slice_of_last_dim(first, x, 0, half)


def _is_rotated_pairs(node: Any, x: Any, half: int) -> bool:
    """Whether ``node`` is ``flatten(stack([-x[..., 1::2], x[..., ::2]], -1), -2)``."""
    if not isinstance(node, torch.fx.Node) or node.target != _aten.flatten.using_ints or node.args[1:] not in ((-2,), (3,)):
        return False
    stacked = node.args[0]
    if not isinstance(stacked, torch.fx.Node) or stacked.target != _aten.stack.default or len(stacked.args[0]) != 2 \
            or stacked.args[1:] not in ((-1,), (4,)):
        return False
    negated, even = stacked.args[0]
    if not isinstance(negated, torch.fx.Node) or negated.target != _aten.neg.default:
        return False
    return _slice_of_last_dim(negated.args[0], x, 1, None, 2) and _slice_of_last_dim(even, x, 0, None, 2)


def _table(node: Any, equal_parts: Any = _has_equal_halves) -> Any:
    """The (B, S, D) table of ``unsqueeze(table, 1)``, when ``equal_parts`` holds of it."""
    if isinstance(node, torch.fx.Node) and node.target == _aten.unsqueeze.default and node.args[1] == 1:
        table = node.args[0]
        if isinstance(node_value(table), torch.Tensor) and node_value(table).dim() == 3 and equal_parts(table):
            return table
    return None


@dataclass(frozen=True)
class RotaryMatch(Match):
    x: torch.fx.Node  # (B, heads, S, D)
    cos: torch.fx.Node  # the (B or 1, S, D) tables, halves (or pairs) equal, or (B or 1, S, D/2)
    sin: torch.fx.Node
    half: int
    interleaved: bool = False  # pairs (x[2i], x[2i+1]) rotated by entry 2i of the whole tables


def _match_sum(node: torch.fx.Node, is_rotated: Any, equal_parts: Any, interleaved: bool) -> RotaryMatch | Refusal | None:
    """``x * cos + turned * sin`` at ``node`` (terms and factors in any order), ``turned``
    of ``x`` as ``is_rotated`` says, tables whose parts are equal as ``equal_parts`` says."""
    for direct, rotated in operand_orders(node, (_aten.add.Tensor,)):
        for x, cos in operand_orders(direct, PRODUCTS):
            x_value = node_value(x)  # a size's SymInt among products of sizes (pooling bounds) is no tensor
            if not isinstance(x_value, torch.Tensor) or x_value.dim() != 4 or not isinstance(x_value.shape[-1], int) or x_value.shape[-1] % 2:
                continue
            half = x_value.shape[-1] // 2
            for turned, sin in operand_orders(rotated, PRODUCTS):
                cos_table, sin_table = _table(cos, equal_parts), _table(sin, equal_parts)
                if is_rotated(turned, x, half) and cos_table is not None and sin_table is not None:
                    return _kernel_match(node, x, cos_table, sin_table, half, interleaved)
    return None


def match(node: torch.fx.Node, target: FusionTarget) -> RotaryMatch | Refusal | None:
    """Anchored at the sum ``x * cos + rotate_half(x) * sin`` (terms and factors in any order)."""
    return _match_sum(node, _is_rotated_half, _has_equal_halves, False)


def match_interleaved(node: torch.fx.Node, target: FusionTarget) -> RotaryMatch | Refusal | None:
    """Anchored at the sum ``x * cos + rotate_pairs(x) * sin`` (terms and factors in any
    order), ``rotate_pairs(x)`` the pairs ``(x[2i], x[2i+1])`` turned to ``(-x[2i+1], x[2i])``."""
    return _match_sum(node, _is_rotated_pairs, _has_equal_pairs, True)


def _kernel_match(node: torch.fx.Node, x: torch.fx.Node, cos: torch.fx.Node, sin: torch.fx.Node, half: int,
                  interleaved: bool = False) -> RotaryMatch | Refusal:
    """The rotation of ``x`` by the tables ``cos``/``sin`` at ``node``, or why the kernel cannot take it."""
    x_value = node_value(x)
    if not all(same_size(node_value(t).shape[0], x_value.shape[0]) or same_size(node_value(t).shape[0], 1) for t in (cos, sin)):
        return Refusal("tables for another batch size")
    if x_value.dtype not in FLOATS_ORT_RUNS:
        return Refusal(f"{x_value.dtype} (onnxruntime's RotaryEmbedding runs float32 and float16)")
    return RotaryMatch(node, x, cos, sin, half, interleaved)


def _half_of(node: Any, chunk: Any = None) -> tuple[torch.fx.Node, int] | None:
    """``(chunk, i)`` when ``node`` is half ``i`` of ``chunk(x, 2, -1)`` (``chunk`` that one, if given)."""
    if not isinstance(node, torch.fx.Node) or node.target != operator.getitem or node.args[1] not in (0, 1):
        return None
    source = node.args[0]
    if not isinstance(source, torch.fx.Node) or source.target != _aten.chunk.default or (chunk is not None and source is not chunk):
        return None
    dim = source.args[2] if len(source.args) > 2 else 0
    return (source, node.args[1]) if source.args[1] == 2 and dim in (-1, 3) else None


def _half_products(node: Any, targets: Any) -> list[tuple[Any, Any, Any, Any]]:
    """``(a, f, b, g)`` for each reading of ``node`` as ``a * f op b * g`` (``op`` among
    ``targets``; ``a * f`` first for a difference)."""
    if not isinstance(node, torch.fx.Node) or node.target not in targets or len(node.args) != 2 or node.kwargs:
        return []
    orders = [tuple(node.args)] if node.target == _aten.sub.Tensor else [tuple(node.args), tuple(node.args[::-1])]
    return [(a, f, b, g) for left, right in orders for a, f in operand_orders(left, PRODUCTS)
            for b, g in operand_orders(right, PRODUCTS)]


def _half_table(node: Any) -> Any:
    """The (B, S, D/2) table of ``unsqueeze(table, 1)``."""
    if isinstance(node, torch.fx.Node) and node.target == _aten.unsqueeze.default and node.args[1] == 1:
        table = node.args[0]
        return table if node_value(table) is not None and node_value(table).dim() == 3 else None
    return None


def match_halves(node: torch.fx.Node, target: FusionTarget) -> RotaryMatch | Refusal | None:
    """Anchored at ``cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)``, ``x1, x2`` the
    halves of ``x``'s last dim (``chunk``), ``cos``/``sin`` half tables (B, 1, S, D/2)."""
    if len(node.args) < 2 or node.args[1] not in (-1, 3) or len(node.args[0]) != 2:
        return None
    difference, total = node.args[0]
    for first, cos, second, sin in _half_products(difference, (_aten.sub.Tensor,)):
        halves = _half_of(first), _half_of(second)
        if halves[0] is None or halves[1] is None or halves[0][0] is not halves[1][0] or [h[1] for h in halves] != [0, 1]:
            continue
        chunk = halves[0][0]
        if not any(b_cos is cos and a_sin is sin and _half_of(b, chunk) == (chunk, 1) and _half_of(a, chunk) == (chunk, 0)
                   for b, b_cos, a, a_sin in _half_products(total, (_aten.add.Tensor,))):
            continue
        x, cos_table, sin_table = chunk.args[0], _half_table(cos), _half_table(sin)
        x_value = node_value(x)
        if cos_table is None or sin_table is None or x_value is None or x_value.dim() != 4 \
                or not isinstance(x_value.shape[-1], int) or x_value.shape[-1] % 2:
            return None
        half = x_value.shape[-1] // 2
        if any(node_value(t).shape[-1] != half for t in (cos_table, sin_table)):
            return None
        return _kernel_match(node, x, cos_table, sin_table, half)
    return None


def replace(graph: torch.fx.Graph, found: RotaryMatch) -> Replacements:
    """The kernel reads the first half of each table (every other entry, interleaved), one
    table per sequence."""
    node, x = found.anchor, found.x
    batch = node_value(x).shape[0]
    with graph.inserting_before(node):
        halves = []
        for table in (found.cos, found.sin):
            first_half = table
            if node_value(table).shape[-1] != found.half:  # a whole table (halves or pairs equal)
                part = (0, 2**63 - 1, 2) if found.interleaved else (0, found.half)
                first_half = new_call(graph, _aten.slice.Tensor, (table, -1, *part), node,
                                      like=_aten.slice.Tensor(node_value(table), -1, *part))
            if not same_size(node_value(table).shape[0], batch):
                # one table for every sequence (positions shared): the kernel wants one per sequence
                size = batch if isinstance(batch, int) else new_call(graph, _aten.sym_size.int, (x, 0), node, like=batch)
                first_half = new_call(graph, _aten.expand.default, (first_half, [size, -1, -1]), node,
                                      like=node_value(first_half).expand(batch, -1, -1))
            halves.append(first_half)
        interleaved = (True,) if found.interleaved else ()
        fused = new_call(graph, torch.ops.fx2onnx.rotary.default, (x, *halves, *interleaved), node, like=node_value(node))
    return [(node, fused)]


RULE = FusionRule("rotary", "RotaryEmbedding", _aten.add.Tensor, FUSED_KERNELS_OPSET, False, match, replace)
INTERLEAVED_RULE = FusionRule("rotary_interleaved", "RotaryEmbedding", _aten.add.Tensor, FUSED_KERNELS_OPSET, False,
                              match_interleaved, replace)
HALVES_RULE = FusionRule("rotary_halves", "RotaryEmbedding", _aten.cat.default, FUSED_KERNELS_OPSET, False, match_halves, replace)
