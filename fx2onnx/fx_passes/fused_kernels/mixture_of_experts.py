"""A mixture of experts routed by a softmax's top k as onnxruntime's ``MoE``.

transformers 5's experts (``grouped_mm`` implementation, the one a capture takes) sort
the token-expert pairs by expert, run each expert's gate-up and down projections over its
rows (``transformers::grouped_mm_fallback``, which gathers each row's matrices, or
torch's ``_grouped_mm`` in bfloat16), weigh the
rows by their routing weights, put them back in token order and sum each token's ``k``
rows. Anchored at that sum, the pattern is read back to what the kernel takes: the tokens,
the router's logits (the kernel takes the softmax and the top k itself, renormalized
or not), the expert weights and biases, and the SwiGLU's constants:

- gpt-oss: ``topk(logits)`` then a softmax of the ``k`` values (the renormalized
  softmax), gate and up rows interleaved, the gate clamped below the limit and the up
  within it, ``g * sigmoid(alpha * g) * (u + 1)``, biases;
- Mixtral, Qwen2-MoE, Qwen3-MoE and the others of that router: ``topk(softmax(logits))``,
  divided by their sum where the config says so, ``silu(gate) * up`` of the halves, no bias.

The kernel's CPU form reads gate and up rows interleaved: halves side by side are
interleaved by a reshape of the weight (written in that layout, ``onnx_passes/expert_weights``).
Experts of another activation or routing stay as they are, with the reason.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch

from fx2onnx.fx_passes.fused_kernels.editing import new_call
from fx2onnx.fx_passes.fused_kernels.matching import (
    FLOATS_ORT_RUNS, FUSED_KERNELS_OPSET, ONNXRUNTIME, PRODUCTS, SUMS, FusionRule, FusionTarget, Match, Refusal,
    Replacements, arguments, node_value, operand_orders,
)
from fx2onnx.fx_passes.remove_identity_views import RESHAPES

_aten = torch.ops.aten
_LAST_DIM = (-1, 1)  # of a (tokens, k) or (tokens, experts) tensor
# steps that keep a tensor's values (a cast to its own dtype is one)
_SAME_VALUES = {_aten.clone.default, _aten.contiguous.default, _aten.alias.default}
_CASTS = {_aten._to_copy.default, _aten.to.dtype}


def _grouped_mm() -> tuple[Any, ...]:
    """The grouped matmuls of transformers' experts: torch's (bfloat16 under a capture)
    and transformers' own operator for the other types, when transformers registered it."""
    fallback = getattr(getattr(torch.ops, "transformers", None), "grouped_mm_fallback", None)
    return (_aten._grouped_mm.default, *(() if fallback is None else (fallback.default,)))


@dataclass(frozen=True)
class Swiglu:
    """The experts' activation ``g * sigmoid(alpha * g) * (u + beta)``, ``g`` clamped below
    ``limit``, ``u`` within ``±limit`` (None: no clamp); ``interleaved``: gate and up rows
    alternate in the gate-up projection (else its halves)."""

    interleaved: bool
    alpha: float = 1.0
    beta: float = 0.0
    limit: float | None = None


@dataclass(frozen=True)
class MixtureOfExpertsMatch(Match):
    """The operands of the kernel: ``tokens`` (T, H), the router's ``logits`` (T, E), the
    projections as the grouped matmuls take them (E, K, N) with their biases, ``k``,
    ``normalize`` (the top k's weights renormalized) and the activation."""

    tokens: torch.fx.Node
    logits: torch.fx.Node
    gate_up: torch.fx.Node
    gate_up_bias: torch.fx.Node | None
    down: torch.fx.Node
    down_bias: torch.fx.Node | None
    k: int
    normalize: bool
    activation: Swiglu


def _is(node: Any, *targets: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def _through_casts(node: Any) -> Any:
    """``node`` with casts that keep its dtype and copies of its values taken off."""
    while _is(node, *_CASTS, *_SAME_VALUES):
        source = node.args[0]
        if node.target in _CASTS and (node_value(source) is None or node_value(source).dtype != node_value(node).dtype):
            return node
        node = source
    return node


def _item(node: Any, index: int) -> Any:
    """The node ``x`` when ``node`` is ``x[index]`` of a tuple-valued call."""
    return node.args[0] if _is(node, operator.getitem) and node.args[1] == index else None


def _indexed_by(node: Any) -> tuple[Any, Any] | None:
    """``(x, i)`` when ``node`` is ``x[i]`` (``aten.index`` along the first dim)."""
    if _is(node, _aten.index.Tensor) and len(node.args[1]) == 1 and node.args[1][0] is not None:
        return node.args[0], node.args[1][0]
    return None


def _flattened(node: Any) -> Any:
    """``x`` when ``node`` is ``x.reshape(-1)``."""
    if _is(node, *RESHAPES) and node_value(node) is not None and node_value(node).dim() == 1:
        return node.args[0]
    return None


@dataclass(frozen=True)
class _Sorted:
    """``sort(indices.reshape(-1))``: the expert of each sorted pair and the order (perm)."""

    indices: torch.fx.Node
    experts: torch.fx.Node | None
    order: torch.fx.Node


def _sorted_pairs(order: Any) -> _Sorted | None:
    sort = _item(order, 1)
    if not _is(sort, _aten.sort.default) or len(sort.args) > 1 or sort.kwargs.get("descending", False):
        return None
    indices = _flattened(sort.args[0])
    experts = next((user for user in sort.users if _item(user, 0) is sort), None)
    return None if indices is None else _Sorted(indices, experts, order)


def _unsorted_sum(anchor: torch.fx.Node) -> tuple[torch.fx.Node, _Sorted] | None:
    """``(weighted rows in expert order, the sort)`` when ``anchor`` is
    ``rows[inverse(perm)].view(T, k, H).sum(1)``."""
    args = arguments(anchor)
    if list(args["dim"] or ()) != [1] or args["keepdim"] or args.get("dtype") is not None:
        return None
    view = args["self"]
    if not _is(view, *RESHAPES) or node_value(view) is None or node_value(view).dim() != 3:
        return None
    gathered = _indexed_by(view.args[0])
    if gathered is None or not _is(gathered[1], _aten.index_put.default):
        return None
    inverse = gathered[1]  # empty_like(perm) with perm's positions written at perm
    empty, written = inverse.args[:2]
    if len(written) != 1 or not _is(empty, _aten.empty_like.default) or empty.args[0] is not written[0]:
        return None
    order = written[0]
    pairs = _sorted_pairs(order)
    return None if pairs is None else (gathered[0], pairs)


def _grouped_rows(node: Any, pairs: _Sorted, offsets: Any = None) -> tuple[Any, Any, Any, Any] | None:
    """``(input rows, weight, bias, offsets)`` of ``grouped_mm(rows, weight, offsets) (+ bias[sorted experts])``."""
    product, bias = node, None
    for term, other in operand_orders(node, SUMS):
        indexed = _indexed_by(other)
        if _is(term, *_grouped_mm()) and indexed is not None and indexed[1] is pairs.experts:
            product, bias = term, indexed[0]
            break
    if not _is(product, *_grouped_mm()) or (offsets is not None and product.args[2] is not offsets):
        return None
    rows, weight, offs = product.args[:3]
    return rows, weight, bias, offs


def _counts_of(offsets: Any, pairs: _Sorted, experts: int) -> bool:
    """Whether ``offsets`` are ``cumsum(histc(sorted experts, experts bins))``: the row
    groups are the sorted pairs' experts."""
    if not _is(offsets, _aten.cumsum.default):
        return False
    counts = offsets.args[0]
    if _is(counts, *_CASTS):  # histc's float counts cast to the cumsum's integers
        counts = counts.args[0]
    if not _is(counts, _aten.histc.default):
        return False
    histc = arguments(counts)
    source = histc["self"]
    if _is(source, *_CASTS):
        source = source.args[0]
    return source is pairs.experts and histc["bins"] == experts and histc["min"] == 0 and histc["max"] == experts - 1


def _halves(gate: Any, up: Any) -> tuple[Any, bool] | None:
    """``(h, interleaved)`` when ``gate`` and ``up`` are ``h[:, ::2]`` and ``h[:, 1::2]``,
    or ``h``'s first and second halves along its last dim."""
    if _is(gate, _aten.slice.Tensor) and _is(up, _aten.slice.Tensor) and gate.args[0] is up.args[0]:
        g, u = arguments(gate), arguments(up)
        if g["dim"] in _LAST_DIM and u["dim"] in _LAST_DIM and g["step"] == u["step"] == 2 and g["start"] in (0, None) \
                and u["start"] == 1:
            return gate.args[0], True
    first, second = _item(gate, 0), _item(up, 1)
    if first is None or first is not second:
        return None
    split = arguments(first)
    if _is(first, _aten.chunk.default):
        halved = split["chunks"] == 2
    elif _is(first, _aten.split.Tensor, _aten.split_with_sizes.default):
        half = node_value(first.args[0]).shape[-1] // 2
        halved = split.get("split_size", split.get("split_sizes")) in (half, [half, half])
    else:
        return None
    return (first.args[0], False) if halved and split["dim"] in _LAST_DIM else None


def _clamped(node: Any, low: float | None, high: float) -> Any:
    """``x`` when ``node`` is ``clamp(x, low, high)``."""
    if _is(node, _aten.clamp.default):
        args = arguments(node)
        if args["min"] == low and args["max"] == high:
            return node.args[0]
    return None


def _gated(node: Any) -> tuple[Any, float] | None:
    """``(g, alpha)`` when ``node`` is ``silu(g)`` or ``g * sigmoid(alpha * g)``."""
    if _is(node, _aten.silu.default):
        return node.args[0], 1.0
    for gate, sigmoid in operand_orders(node, PRODUCTS):
        if not _is(sigmoid, _aten.sigmoid.default):
            continue
        inner = sigmoid.args[0]
        if inner is gate:
            return gate, 1.0
        alpha = next((a for g, a in operand_orders(inner, PRODUCTS) if g is gate and isinstance(a, float)), None)
        if alpha is not None:
            return gate, alpha
    return None


def _swiglu(node: Any) -> tuple[Any, Swiglu] | None:
    """``(gate-up rows, activation)`` when ``node`` is a SwiGLU the kernel computes."""
    for gated, up in operand_orders(node, PRODUCTS):
        found = _gated(gated)
        if found is None:
            continue
        gate, alpha = found
        beta = 0.0
        for term, shift in operand_orders(up, SUMS):
            if isinstance(shift, (int, float)):
                up, beta = term, float(shift)
                break
        limit = None
        inner_gate = gate.args[0] if _is(gate, _aten.clamp.default) else None
        if inner_gate is not None:
            limit = arguments(gate)["max"]
            if arguments(gate)["min"] is not None or not isinstance(limit, float):
                continue
            inner_up = _clamped(up, -limit, limit)
            if inner_up is None:
                continue
            gate, up = inner_gate, inner_up
        halves = _halves(gate, up)
        if halves is not None:
            return halves[0], Swiglu(halves[1], alpha, beta, limit)
    return None


def _routing(indices: Any, weights: Any) -> tuple[Any, int, bool] | Refusal | None:
    """``(logits, k, normalize)`` when ``weights`` and ``indices`` are the top k of a
    softmax of the logits: a softmax of ``topk(logits)``'s values (renormalized), or
    ``topk(softmax(logits))``'s values, divided by their sum (renormalized) or not."""
    topk = _item(indices, 1)
    if not _is(topk, _aten.topk.default):
        return None
    top = arguments(topk)
    if top["dim"] not in _LAST_DIM or not top["largest"]:
        return Refusal("the experts are chosen by the smallest router scores")
    weights = _through_casts(weights)
    if _is(weights, _aten.softmax.int, _aten._softmax.default) and _item(weights.args[0], 0) is topk:
        if weights.args[1] not in _LAST_DIM:
            return None
        return _through_casts(topk.args[0]), top["k"], True
    normalize = False
    if _is(weights, _aten.div.Tensor) and _is(weights.args[1], _aten.sum.dim_IntList) \
            and weights.args[1].args[0] is weights.args[0]:
        total = arguments(weights.args[1])
        if list(total["dim"]) not in ([-1], [1]) or not total["keepdim"]:
            return None
        weights, normalize = _through_casts(weights.args[0]), True
    if _item(weights, 0) is not topk:
        return None
    probabilities = _through_casts(topk.args[0])
    if not _is(probabilities, _aten.softmax.int, _aten._softmax.default) or probabilities.args[1] not in _LAST_DIM:
        return Refusal("the routing weights are no softmax of the router's logits (the kernel's routing)")
    return _through_casts(probabilities.args[0]), top["k"], normalize


def match(node: torch.fx.Node, target: FusionTarget) -> MixtureOfExpertsMatch | Refusal | None:
    """The experts whose outputs ``node`` sums per token, if it is that sum; None where the
    target does not allow onnxruntime's kernels."""
    if target.runtime != ONNXRUNTIME:
        return None
    found = _unsorted_sum(node)
    if found is None:
        return None
    weighted, pairs = found
    down, weights = None, None
    for projected, factor in operand_orders(weighted, PRODUCTS):
        column = factor.args[0] if _is(factor, _aten.unsqueeze.default) and factor.args[1] in (-1, 1) else None
        indexed = _indexed_by(column)
        if indexed is not None and indexed[1] is pairs.order and _flattened(indexed[0]) is not None:
            down, weights = _grouped_rows(projected, pairs), _flattened(indexed[0])
            break
    if down is None or pairs.experts is None:
        return None
    activated, down_weight, down_bias, offsets = down
    activation = _swiglu(activated)
    if activation is None:
        return Refusal("the experts' activation is no SwiGLU (silu(gate) * up, or gpt-oss's clamped one)")
    gate_up = _grouped_rows(activation[0], pairs, offsets)
    if gate_up is None:
        return None
    rows, gate_up_weight, gate_up_bias, _ = gate_up
    indexed = _indexed_by(rows)
    if indexed is None:
        return None
    tokens, token_of_pair = indexed
    routing = _routing(pairs.indices, weights)
    if not isinstance(routing, tuple):
        return routing
    logits, k, normalize = routing
    if not (_is(token_of_pair, _aten.floor_divide.default) and token_of_pair.args[0] is pairs.order
            and token_of_pair.args[1] == k):
        return None
    values = [node_value(x) for x in (tokens, logits, gate_up_weight, down_weight)]
    if any(v is None for v in values) or values[0].dim() != 2 or values[1].dim() != 2 or values[2].dim() != 3:
        return None
    experts = values[2].shape[0]
    if not _counts_of(offsets, pairs, experts) or values[1].shape[1] != experts:
        return None
    if values[0].dtype not in FLOATS_ORT_RUNS or any(v.dtype != values[0].dtype for v in values[1:]):
        return Refusal(f"{values[0].dtype} tokens, {values[1].dtype} router logits, {values[2].dtype} experts (onnxruntime's "
                       "MoE runs float32 and float16, all of one type)")
    return MixtureOfExpertsMatch(node, tokens, logits, gate_up_weight, gate_up_bias, down_weight, down_bias, k, normalize,
                                 activation[1])


def _kernel_layout(graph: torch.fx.Graph, weight: torch.fx.Node, source: torch.fx.Node) -> torch.fx.Node:
    """(E, N, K) of a grouped matmul's (E, K, N) weight: the weight itself when that is a
    transpose of it, else its transpose."""
    if _is(weight, _aten.transpose.int) and sorted(d % 3 for d in weight.args[1:3]) == [1, 2]:
        return weight.args[0]
    return new_call(graph, _aten.transpose.int, (weight, 1, 2), source)


def _interleaved(graph: torch.fx.Graph, gate_up: torch.fx.Node, source: torch.fx.Node) -> torch.fx.Node:
    """(E, 2I, H) rows ``g0, u0, g1, u1, ...`` of rows ``g0 ... | u0 ...``."""
    experts, rows, width = node_value(gate_up).shape
    halves = new_call(graph, _aten.view.default, (gate_up, [experts, 2, rows // 2, width]), source)
    swapped = new_call(graph, _aten.transpose.int, (halves, 1, 2), source)
    return new_call(graph, _aten.reshape.default, (swapped, [experts, rows, width]), source)


def replace(graph: torch.fx.Graph, found: MixtureOfExpertsMatch) -> Replacements:
    """The kernel before the sum, reading the tokens, the logits and the experts' weights
    in its layout; it takes over the sum's uses (the routing and the grouped products go
    with the sum)."""
    node, activation = found.anchor, found.activation
    with graph.inserting_before(node):
        gate_up = _kernel_layout(graph, found.gate_up, node)
        if not activation.interleaved:
            gate_up = _interleaved(graph, gate_up, node)
        down = _kernel_layout(graph, found.down, node)
        inputs = (found.tokens, found.logits, gate_up, found.gate_up_bias, down, found.down_bias, found.k, found.normalize,
                  activation.alpha, activation.beta, activation.limit)
        fused = new_call(graph, torch.ops.fx2onnx.mixture_of_experts.default, inputs, node, like=node_value(node))
    return [(node, fused)]


RULE = FusionRule("mixture_of_experts", "MoE", _aten.sum.dim_IntList, FUSED_KERNELS_OPSET, False, match, replace)
