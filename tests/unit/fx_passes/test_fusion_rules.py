"""Each fused-kernel rule on small FX graphs (captured by torch.export, as the pass sees
them): its read-only ``match`` finds the operands (the graph untouched), refuses with the
note's reason, or finds nothing; the driver's replacement puts the new call in, erases
what only the pattern read, and computes what the graph computed before."""

from __future__ import annotations

import functools
import math
import operator

import pytest
import torch
import torch.nn.functional as F

from diagnostics import DiagnosticContext, DiagnosticOptions, Level
from dispatcher import OnnxRegistry
from fx2onnx.fx_passes.decompose_unsupported import decompose_unsupported
from fx2onnx.fx_passes.fused_kernels import FUSED_KERNELS_OPSET, RULES, FusionTarget, fuse_kernels
from fx2onnx.fx_passes.fused_kernels import (
    attention, attention_sinks, gelu, group_query_attention, mixture_of_experts, rms_normalization, rotary_embedding,
)
from fx2onnx.fx_passes.fused_kernels.matching import Refusal
from fx2onnx.fx_passes.remove_assertions import remove_assertions
from fx2onnx.fx_passes.remove_identity_views import remove_identity_views

_aten, _fx2onnx = torch.ops.aten, torch.ops.fx2onnx
CACHE_TARGET = FusionTarget("onnxruntime", "attention_mask")


class Fn(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.forward = fn  # its parameters' names are the placeholders'


@functools.cache
def _registry() -> OnnxRegistry:
    return OnnxRegistry()


def _graph(fn, *args) -> torch.fx.GraphModule:
    """``fn``'s graph as the fused-kernel pass sees it: captured, decomposed where no ONNX
    function covers an operator, assertions and identity views removed."""
    program = torch.export.export(Fn(fn), args)
    graph_module = decompose_unsupported(program, program.graph_module, _registry()).graph_module
    remove_assertions(graph_module)
    remove_identity_views(graph_module)
    return graph_module


def _anchor(graph_module: torch.fx.GraphModule, target) -> torch.fx.Node:
    (node,) = [n for n in graph_module.graph.nodes if n.target == target]
    return node


def _calls(graph_module: torch.fx.GraphModule, target) -> list[torch.fx.Node]:
    return [n for n in graph_module.graph.nodes if n.target == target]


def _fuse(graph_module: torch.fx.GraphModule, opset: int = FUSED_KERNELS_OPSET, target: FusionTarget = FusionTarget(),
          ) -> tuple[int, list[str]]:
    """The pass on ``graph_module``: how many nodes it fused, and its notes."""
    context = DiagnosticContext("fx2onnx", "test", DiagnosticOptions())
    fused = fuse_kernels(graph_module, opset, context, True, target)
    return fused, [d.message for d in context.diagnostics if d.level is Level.NOTE]


def _assert_untouched_by_match(rule_match, graph_module, anchor, target=FusionTarget()):
    """``rule_match``'s result at ``anchor``, checked to leave the graph as it was."""
    before = str(graph_module.graph)
    found = rule_match(anchor, target)
    assert str(graph_module.graph) == before
    return found


def _assert_unchanged(graph_module, **fuse_options) -> list[str]:
    before = str(graph_module.graph)
    fused, notes = _fuse(graph_module, **fuse_options)
    assert fused == 0 and str(graph_module.graph) == before
    return notes


def test_rules_are_one_table_with_attention_over_a_cache_first():
    assert [rule.name for rule in RULES] == ["group_query_attention", "packed_attention_operands", "attention",
                                             "group_query_attention_sinks", "rotary", "rotary_halves", "rotary_interleaved",
                                             "gelu", "rms_norm", "mixture_of_experts"]
    assert [rule.kernel for rule in RULES] == ["GroupQueryAttention", "GroupQueryAttention", "Attention", "GroupQueryAttention",
                                               "RotaryEmbedding", "RotaryEmbedding", "RotaryEmbedding", "Gelu", "RMSNormalization",
                                               "MoE"]


# -- gelu -------------------------------------------------------------------------------------------
def test_gelu_is_matched_and_replaced():
    x = torch.randn(3, 8)
    graph_module = _graph(lambda x: F.gelu(x, approximate="tanh") * 2, x)
    found = _assert_untouched_by_match(gelu.match, graph_module, _anchor(graph_module, _aten.gelu.default))
    assert isinstance(found, gelu.GeluMatch) and found.x.name == "x" and found.approximate == "tanh"
    expected = graph_module(x)
    assert _fuse(graph_module, opset=20) == (1, [])
    (call,) = _calls(graph_module, _fx2onnx.gelu.default)
    assert call.args == (found.x, "tanh") and not _calls(graph_module, _aten.gelu.default)
    assert call.meta["val"].shape == (3, 8) and "nn_module_stack" in call.meta  # the source metadata of the gelu
    torch.testing.assert_close(graph_module(x), expected)


def test_gelu_in_float16_is_refused_with_the_reason():
    graph_module = _graph(lambda x: F.gelu(x), torch.randn(3, 8, dtype=torch.float16))
    found = gelu.match(_anchor(graph_module, _aten.gelu.default), FusionTarget())
    assert found == Refusal("torch.float16 (onnxruntime's Gelu runs float32 only)")
    assert _assert_unchanged(graph_module) == ["`gelu` (gelu) kept unfused: torch.float16 (onnxruntime's Gelu runs float32 only)."]


def test_a_rule_below_its_opset_is_skipped_with_a_note_when_the_opset_was_chosen():
    graph_module = _graph(lambda x: F.gelu(x), torch.randn(3, 8))
    (note,) = _assert_unchanged(graph_module, opset=19)
    assert note.startswith("1 gelu node(s) kept unfused: its fused kernel is an ONNX operator of opset 20")


# -- RMS normalization ---------------------------------------------------------------------------
def _transformers_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return weight * h.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rms_normalization_is_matched_and_replaced(dtype):
    x, weight = torch.randn(2, 3, 16, dtype=dtype), torch.randn(16, dtype=dtype)
    graph_module = _graph(_transformers_norm, x, weight)
    found = _assert_untouched_by_match(rms_normalization.match, graph_module, _anchor(graph_module, _aten.rsqrt.default))
    assert isinstance(found, rms_normalization.RMSNormMatch)
    assert (found.x.name, found.scale.name, found.eps, found.trailing_dims) == ("x", "weight", 1e-6, 1)
    expected = graph_module(x, weight)
    assert _fuse(graph_module) == (1, [])
    (call,) = _calls(graph_module, _fx2onnx.rms_norm.default)
    assert call.args == (found.x, found.scale, 1e-6, 1)
    # the normalization's nodes are gone, the float32 cast of the input with them
    assert not {_aten.rsqrt.default, _aten.mean.dim, _aten.pow.Tensor_Scalar, _aten._to_copy.default} & {
        n.target for n in graph_module.graph.nodes}
    torch.testing.assert_close(graph_module(x, weight), expected, rtol=1e-3, atol=1e-3)


def test_rms_normalization_with_the_operands_in_the_other_order_is_matched():
    def norm(x, weight):
        y = x * x
        return weight * (torch.rsqrt(1e-5 + y.pow(2).mean((-2, -1), keepdim=True)) * y)

    x, weight = torch.randn(2, 3, 16), torch.randn(3, 16)
    graph_module = _graph(norm, x, weight)
    found = rms_normalization.match(_anchor(graph_module, _aten.rsqrt.default), FusionTarget())
    assert isinstance(found, rms_normalization.RMSNormMatch) and (found.eps, found.trailing_dims) == (1e-5, 2)
    expected = graph_module(x, weight)
    assert _fuse(graph_module) == (1, [])
    torch.testing.assert_close(graph_module(x, weight), expected)


def test_rms_normalization_without_a_scale_is_refused_with_the_reason():
    graph_module = _graph(lambda x: F.rms_norm(x, (16,)), torch.randn(2, 3, 16))
    found = rms_normalization.match(_anchor(graph_module, _aten.rsqrt.default), FusionTarget())
    assert found == Refusal("no scale over the normalized dims follows the normalization")
    assert _assert_unchanged(graph_module) == [
        "`rsqrt` (rms_norm) kept unfused: no scale over the normalized dims follows the normalization."]


def test_rms_normalization_in_float64_is_refused_with_the_reason():
    graph_module = _graph(_transformers_norm, torch.randn(2, 3, 16, dtype=torch.float64), torch.randn(16, dtype=torch.float64))
    found = rms_normalization.match(_anchor(graph_module, _aten.rsqrt.default), FusionTarget())
    assert isinstance(found, Refusal) and found.reason.startswith("torch.float64 input, torch.float64 scale")
    _assert_unchanged(graph_module)


def test_an_rsqrt_of_no_mean_of_squares_is_not_matched():
    graph_module = _graph(lambda x, w: w * (x * torch.rsqrt(x.mean(-1, keepdim=True) + 1e-6)), torch.randn(2, 16), torch.randn(16))
    assert rms_normalization.match(_anchor(graph_module, _aten.rsqrt.default), FusionTarget()) is None
    assert _assert_unchanged(graph_module) == []


# -- rotary embedding ------------------------------------------------------------------------------
def _tables(positions: torch.Tensor, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 16, 2, dtype=dtype) / 16))
    freqs = positions[..., None].to(dtype) * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)


def _rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    cos, sin = _tables(positions)
    return x * cos + torch.cat([-x[..., 8:], x[..., :8]], dim=-1) * sin


def _rotate_written_the_other_way(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    cos, sin = _tables(positions)
    return sin * torch.cat([-x[..., 8:], x[..., :8]], dim=-1) + cos * x


@pytest.mark.parametrize("rotate", [_rotate, _rotate_written_the_other_way])
def test_the_rotary_embedding_is_matched_and_replaced(rotate):
    x, positions = torch.randn(2, 4, 5, 16), torch.arange(3, 8).expand(2, 5)
    graph_module = _graph(rotate, x, positions)
    found = _assert_untouched_by_match(rotary_embedding.match, graph_module, _anchor(graph_module, _aten.add.Tensor))
    assert isinstance(found, rotary_embedding.RotaryMatch) and found.x.name == "x" and found.half == 8
    assert found.cos.target == _aten.cos.default and found.sin.target == _aten.sin.default
    expected = graph_module(x, positions)
    assert _fuse(graph_module) == (1, [])
    (call,) = _calls(graph_module, _fx2onnx.rotary.default)
    assert call.args[0] is found.x
    assert [(a.target, a.args[0]) for a in call.args[1:]] == [(_aten.slice.Tensor, found.cos), (_aten.slice.Tensor, found.sin)]
    assert not _calls(graph_module, _aten.neg.default)  # rotate_half went with the sum
    torch.testing.assert_close(graph_module(x, positions), expected)


def test_the_rotary_embedding_in_float64_is_refused_with_the_reason():
    def rotate(x, positions):
        cos, sin = _tables(positions, torch.float64)
        return x * cos + torch.cat([-x[..., 8:], x[..., :8]], dim=-1) * sin

    graph_module = _graph(rotate, torch.randn(2, 4, 5, 16, dtype=torch.float64), torch.arange(5).expand(2, 5))
    (add,) = [n for n in _calls(graph_module, _aten.add.Tensor) if n.args[0].target == _aten.mul.Tensor]
    assert rotary_embedding.match(add, FusionTarget()) == Refusal(
        "torch.float64 (onnxruntime's RotaryEmbedding runs float32 and float16)")
    assert _assert_unchanged(graph_module) == [
        f"`{add.name}` (rotary) kept unfused: torch.float64 (onnxruntime's RotaryEmbedding runs float32 and float16)."]


def test_tables_of_unknown_halves_are_not_matched():
    def rotate(x, cos, sin):
        return x * cos.unsqueeze(1) + torch.cat([-x[..., 8:], x[..., :8]], dim=-1) * sin.unsqueeze(1)

    graph_module = _graph(rotate, torch.randn(2, 4, 5, 16), torch.randn(2, 5, 16), torch.randn(2, 5, 16))
    assert rotary_embedding.match(_anchor(graph_module, _aten.add.Tensor), FusionTarget()) is None
    assert _assert_unchanged(graph_module) == []  # an add that is not a rotation says nothing


def _rotate_halves(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """gpt-oss's form: the halves rotated by half tables (B, 1, S, D/2)."""
    freqs = positions[..., None].float() * (1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16))
    cos, sin = freqs.cos().unsqueeze(1), freqs.sin().unsqueeze(1)
    first, second = torch.chunk(x, 2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


def test_the_rotation_of_halves_is_matched_and_replaced():
    x, positions = torch.randn(2, 4, 5, 16), torch.arange(3, 8).expand(2, 5)
    graph_module = _graph(_rotate_halves, x, positions)
    found = _assert_untouched_by_match(rotary_embedding.match_halves, graph_module, _anchor(graph_module, _aten.cat.default))
    assert isinstance(found, rotary_embedding.RotaryMatch) and found.x.name == "x" and found.half == 8
    expected = graph_module(x, positions)
    assert _fuse(graph_module) == (1, [])
    (call,) = _calls(graph_module, _fx2onnx.rotary.default)
    assert call.args == (found.x, found.cos, found.sin)  # half tables: no slice
    assert not _calls(graph_module, _aten.chunk.default) and not _calls(graph_module, _aten.cat.default)
    torch.testing.assert_close(graph_module(x, positions), expected)


def test_halves_rotated_the_wrong_way_are_not_matched():
    def rotate(x, positions):  # x1 cos + x2 sin: another rotation's sign
        freqs = positions[..., None].float() * 0.5
        cos, sin = freqs.cos().expand(2, 5, 8).unsqueeze(1), freqs.sin().expand(2, 5, 8).unsqueeze(1)
        first, second = torch.chunk(x, 2, dim=-1)
        return torch.cat((first * cos + second * sin, second * cos - first * sin), dim=-1)

    graph_module = _graph(rotate, torch.randn(2, 4, 5, 16), torch.arange(5).expand(2, 5))
    assert rotary_embedding.match_halves(_anchor(graph_module, _aten.cat.default), FusionTarget()) is None
    assert _assert_unchanged(graph_module) == []


def _rotate_pairs(x: torch.Tensor, positions: torch.Tensor, negated: bool = True) -> torch.Tensor:
    """Cohere's form: the pairs (x[2i], x[2i+1]) rotated by tables whose pairs are equal
    (not ``negated``: another rotation's sign)."""
    freqs = positions[..., None].float() * (1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16))
    emb = torch.repeat_interleave(freqs, 2, dim=-1)
    cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)
    odd = x[..., 1::2]
    turned = torch.stack([-odd if negated else odd, x[..., ::2]], dim=-1).flatten(-2)
    return x * cos + turned * sin


@pytest.mark.parametrize("batch", [1, 3])
def test_the_rotation_of_pairs_is_matched_and_replaced_as_interleaved(batch):
    x, positions = torch.randn(batch, 4, 5, 16), torch.arange(3, 8).expand(batch, 5)
    graph_module = _graph(_rotate_pairs, x, positions)
    anchor = _anchor(graph_module, _aten.add.Tensor)
    assert rotary_embedding.match(anchor, FusionTarget()) is None  # not the halves' rule
    found = _assert_untouched_by_match(rotary_embedding.match_interleaved, graph_module, anchor)
    assert isinstance(found, rotary_embedding.RotaryMatch) and found.x.name == "x" and found.interleaved
    expected = graph_module(x, positions)
    torch.testing.assert_close(expected[0], _rotate_pairs(x, positions))  # the graph is the rotation
    assert _fuse(graph_module) == (1, [])
    (call,) = _calls(graph_module, _fx2onnx.rotary.default)
    assert call.args[0] is found.x and call.args[3] is True
    assert [(a.target, a.args[1:]) for a in call.args[1:3]] == [(_aten.slice.Tensor, (-1, 0, 2**63 - 1, 2))] * 2
    assert not _calls(graph_module, _aten.stack.default) and not _calls(graph_module, _aten.neg.default)
    torch.testing.assert_close(graph_module(x, positions), expected)


def test_pairs_rotated_with_the_wrong_sign_or_tables_are_not_matched():
    graph_module = _graph(functools.partial(_rotate_pairs, negated=False), torch.randn(2, 4, 5, 16), torch.arange(5).expand(2, 5))
    assert graph_module.graph.find_nodes(op="call_function", target=_aten.neg.default) == []
    assert rotary_embedding.match_interleaved(_anchor(graph_module, _aten.add.Tensor), FusionTarget()) is None
    assert _assert_unchanged(graph_module) == []
    halves = _graph(_rotate, torch.randn(2, 4, 5, 16), torch.arange(5).expand(2, 5))  # equal halves, not pairs
    assert rotary_embedding.match_interleaved(_anchor(halves, _aten.add.Tensor), FusionTarget()) is None


# -- attention ---------------------------------------------------------------------------------------
def _repeat_kv(t: torch.Tensor) -> torch.Tensor:
    b, h, length, d = t.shape
    return t[:, :, None].expand(b, h, 2, length, d).reshape(b, 2 * h, length, d)


def test_attention_is_matched_with_the_key_and_value_heads_unrepeated():
    q, k, v = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 7, 16), torch.randn(2, 2, 7, 16)
    graph_module = _graph(lambda q, k, v: F.scaled_dot_product_attention(q, _repeat_kv(k), _repeat_kv(v), is_causal=True), q, k, v)
    sdpa = _anchor(graph_module, _aten.scaled_dot_product_attention.default)
    found = _assert_untouched_by_match(attention.match, graph_module, sdpa)
    assert isinstance(found, attention.AttentionMatch) and found.projections is None
    operands = found.operands
    assert [x.name for x in (operands.query, operands.key, operands.value)] == ["q", "k", "v"]
    assert (operands.mask, operands.scale, operands.is_causal, operands.query_heads, operands.key_heads) == (None, 0.25, True, 4, 2)
    expected = graph_module(q, k, v)
    assert _fuse(graph_module) == (1, [])
    (call,) = _calls(graph_module, _fx2onnx.attention.default)
    assert call.args == (operands.query, operands.key, operands.value, None, 0.25, True)
    assert not _calls(graph_module, _aten.expand.default)  # the repetitions went with the attention
    torch.testing.assert_close(graph_module(q, k, v), expected)


@pytest.mark.parametrize("runtime", ["onnxruntime", "standard"])
def test_attention_between_projections_is_matched_in_their_layout(runtime):
    def encoder(q, k, v, mask):
        def split(t):
            return t.view(2, 7, 4, 8).transpose(1, 2)

        return F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=mask).transpose(1, 2).reshape(2, 7, 32)

    args = (torch.randn(2, 7, 32), torch.randn(2, 7, 32), torch.randn(2, 7, 32), torch.randn(2, 1, 7, 7))
    graph_module = _graph(encoder, *args)
    target = FusionTarget(runtime)
    found = attention.match(_anchor(graph_module, _aten.scaled_dot_product_attention.default), target)
    assert isinstance(found, attention.AttentionMatch)
    assert [p.name for p in found.projections] == ["q", "k", "v"] and found.merged.target in (_aten.view.default, _aten.reshape.default)
    assert found.multi_head == (runtime == "onnxruntime")  # onnxruntime's MultiHeadAttention
    expected = graph_module(*args)
    assert _fuse(graph_module, target=target) == (1, [])
    names = lambda call: [a.name if isinstance(a, torch.fx.Node) else a for a in call.args]  # noqa: E731
    if runtime == "onnxruntime":
        (call,) = _calls(graph_module, _fx2onnx.multi_head_attention.default)
        assert names(call) == ["q", "k", "v", "mask", 1 / math.sqrt(8), 4]
    else:
        (call,) = _calls(graph_module, _fx2onnx.attention_3d.default)
        assert names(call) == ["q", "k", "v", "mask", 1 / math.sqrt(8), False, 4, 4]
    assert not _calls(graph_module, _aten.transpose.int)
    torch.testing.assert_close(graph_module(*args), expected)


@pytest.mark.parametrize(("fn", "heads"), [
    (lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, is_causal=True), 4),
    (lambda q, k, v, mask: F.scaled_dot_product_attention(q, _repeat_kv(k), _repeat_kv(v), attn_mask=mask), 2),
    (lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask.expand(2, 4, 7, 7)), 4),
])
def test_attention_multi_head_attention_cannot_take_stays_the_standard_attention(fn, heads):
    """Causal, grouped heads, a mask per head: onnxruntime's MultiHeadAttention takes none of them."""
    def encoder(q, k, v, mask):
        def split(t, count):
            return t.view(2, 7, count, 8).transpose(1, 2)

        return fn(split(q, 4), split(k, heads), split(v, heads), mask).transpose(1, 2).reshape(2, 7, 32)

    args = (torch.randn(2, 7, 32), torch.randn(2, 7, 8 * heads), torch.randn(2, 7, 8 * heads), torch.randn(2, 1, 7, 7))
    graph_module = _graph(encoder, *args)
    found = attention.match(_anchor(graph_module, _aten.scaled_dot_product_attention.default), FusionTarget())
    assert isinstance(found, attention.AttentionMatch) and found.projections is not None and not found.multi_head


@pytest.mark.parametrize(("fn", "reason"), [
    (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.5), "dropout (ONNX Attention has none)"),
    (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(1, 7)),
     "a mask shared by every query (onnxruntime's Attention takes one row per query)"),
    (lambda q, k, v: F.scaled_dot_product_attention(q.double(), k.double(), v.double()),
     "torch.float64 (onnxruntime's Attention runs float32 and float16)"),
])
def test_attention_the_kernel_cannot_take_is_refused_with_the_reason(fn, reason):
    graph_module = _graph(fn, torch.randn(2, 4, 5, 16), torch.randn(2, 4, 7, 16), torch.randn(2, 4, 7, 16))
    sdpa = _anchor(graph_module, _aten.scaled_dot_product_attention.default)
    assert _assert_untouched_by_match(attention.match, graph_module, sdpa) == Refusal(reason)
    assert _assert_unchanged(graph_module) == [f"`{sdpa.name}` (attention) kept unfused: {reason}."]


# -- attention over a cache (GroupQueryAttention) -------------------------------------------------
def _decoder(additive: bool = False, window: int | None = None, window_compare=operator.lt):
    """One decoder attention over a KV cache: (B, S, heads * 8) projections split into
    heads, the new tokens appended to the cache inputs, key/value heads repeated, and a
    boolean (or ``additive``) mask built from ``attention_mask``: causal, over its tokens
    (within a ``window`` of them: their counts' difference compared by ``window_compare``)."""

    def decode(q, k, v, attention_mask, past_key, past_value):
        query, key, value, mask = _heads_over_the_cache(q, k, v, attention_mask, past_key, past_value, window, window_compare)
        if additive:
            mask = torch.where(mask, 0.0, float("-inf"))
        out = F.scaled_dot_product_attention(query, _repeat_kv(key), _repeat_kv(value), attn_mask=mask)
        return out.transpose(1, 2).reshape(*q.shape[:2], 32), key, value

    return decode


def _heads_over_the_cache(q, k, v, attention_mask, past_key, past_value, window=None, window_compare=operator.lt):
    """The query's heads, the caches with the new tokens' heads appended, and the boolean
    mask (causal over ``attention_mask``'s tokens, within a ``window`` of them)."""
    b, s, _ = q.shape

    def heads(t: torch.Tensor, count: int) -> torch.Tensor:
        return t.view(b, s, count, 8).transpose(1, 2)

    key, value = torch.cat([past_key, heads(k, 2)], dim=2), torch.cat([past_value, heads(v, 2)], dim=2)
    total = key.shape[2]
    causal = torch.arange(total)[None, :] <= torch.arange(total - s, total)[:, None]
    mask = causal[None, None] & attention_mask.bool()[:, None, None, :]
    if window is not None:
        counts = attention_mask.cumsum(-1)
        mask = mask & window_compare(counts[:, total - s:, None] - counts[:, None, :], window)[:, None]
    return heads(q, 4), key, value, mask


def _decoder_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, 32), torch.randn(2, 3, 16), torch.randn(2, 3, 16), torch.ones(2, 8, dtype=torch.int64),
            torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8))


def test_attention_over_a_cache_is_matched_and_replaced_by_group_query_attention():
    args = _decoder_inputs()
    graph_module = _graph(_decoder(), *args)
    sdpa = _anchor(graph_module, _aten.scaled_dot_product_attention.default)
    found = _assert_untouched_by_match(group_query_attention.match, graph_module, sdpa, CACHE_TARGET)
    assert isinstance(found, group_query_attention.GroupQueryAttentionMatch)
    assert found.tokens.name == "attention_mask" and found.merged_exactly
    assert [past.name for past, _ in found.caches] == ["past_key", "past_value"]
    assert [p.projection.name for p in found.packed] == ["q", "k", "v"]
    expected = graph_module(*args)
    context = DiagnosticContext("fx2onnx", "test", DiagnosticOptions())
    assert fuse_kernels(graph_module, FUSED_KERNELS_OPSET, context, True, CACHE_TARGET) == 1
    (call,) = _calls(graph_module, _fx2onnx.cached_attention.default)
    assert [a.name for a in call.args[:5]] == ["q", "k", "v", "past_key", "past_value"] and call.args[8:] == (1 / math.sqrt(8), 4, 2)
    # the attention output and both grown caches are the kernel's outputs now
    output = next(n for n in graph_module.graph.nodes if n.op == "output")
    assert [(n.target, n.args[1]) for n in output.args[0]] == [(operator.getitem, 0), (operator.getitem, 1), (operator.getitem, 2)]
    assert not _calls(graph_module, _aten.scaled_dot_product_attention.default) and not _calls(graph_module, _aten.cat.default)
    for got, want in zip(graph_module(*args), expected):
        torch.testing.assert_close(got, want)


def _kernel_given_merged_heads(q, k, v, q_weight, k_weight, positions, past_key, past_value, bias):
    """A model calling the kernel itself (Gemma 3's text steps): query and key split into
    heads (of 16), normalized per head after the split (as Gemma 3) or before it, rotated and put
    side by side again; the value split and merged back."""
    b, s, _ = q.shape

    def heads(t: torch.Tensor, count: int) -> torch.Tensor:
        return t.view(b, s, count, 16).transpose(1, 2)

    def merged(t: torch.Tensor) -> torch.Tensor:
        return t.transpose(1, 2).flatten(2)

    query = _rotate(_transformers_norm(heads(q, 4), q_weight), positions)
    key = _rotate(_transformers_norm(k.view(b, s, 2, 16), k_weight).transpose(1, 2), positions)
    total = torch.scalar_tensor(past_key.shape[2] + s, dtype=torch.int32)
    return _fx2onnx.cached_attention(merged(query), merged(key), merged(heads(v, 2)), past_key, past_value,
                                     (total - 1).expand(b), total, bias, 16 ** -0.5, 4, 2)


def test_a_kernel_given_merged_heads_reads_the_packed_forms():
    args = (torch.randn(2, 3, 64), torch.randn(2, 3, 32), torch.randn(2, 3, 32), torch.randn(16), torch.randn(16),
            torch.arange(5, 8).expand(2, 3), torch.randn(2, 2, 5, 16), torch.randn(2, 2, 5, 16),
            torch.zeros(2, 1, 3, 8).index_fill_(-1, torch.tensor([0, 1]), torch.finfo(torch.float32).min))
    graph_module = _graph(_kernel_given_merged_heads, *args)
    expected = graph_module(*args)
    fused, notes = _fuse(graph_module, target=CACHE_TARGET)
    assert fused == 5 and notes == []  # two norms, two rotations, the kernel's operands
    (call,) = _calls(graph_module, _fx2onnx.cached_attention.default)
    query, key, value = call.args[:3]
    # the rotations on the packed (B, S, heads * D) tensors, each norm on (B, S, heads, D): no transpose left
    assert query.target == key.target == _fx2onnx.rotary_3d.default and value.name == "v"
    assert [(x.args[0].target, x.args[0].args[0].target, x.args[0].args[0].args[0].args[0].name)
            for x in (query, key)] == [(_aten.view.default, _fx2onnx.rms_norm.default, "q"),
                                       (_aten.view.default, _fx2onnx.rms_norm.default, "k")]
    assert not _calls(graph_module, _aten.transpose.int) and not _calls(graph_module, _fx2onnx.rotary.default)
    for got, want in zip(graph_module(*args), expected):
        torch.testing.assert_close(got, want)


def test_a_kernel_given_its_operands_packed_is_left_as_it_is():
    args = (torch.randn(2, 3, 32), torch.randn(2, 3, 16), torch.randn(2, 3, 16), torch.randn(2, 2, 5, 8),
            torch.randn(2, 2, 5, 8), torch.zeros(2, 1, 3, 8))

    def packed(q, k, v, past_key, past_value, bias):
        total = torch.scalar_tensor(8, dtype=torch.int32)
        return _fx2onnx.cached_attention(q, k, v, past_key, past_value, (total - 1).expand(2), total, bias, 8 ** -0.5, 4, 2)

    graph_module = _graph(packed, *args)
    kernel = _anchor(graph_module, _fx2onnx.cached_attention.default)
    assert _assert_untouched_by_match(group_query_attention.match_packed_operands, graph_module, kernel) is None
    _assert_unchanged(graph_module, target=CACHE_TARGET)


@pytest.mark.parametrize("padding", [0, 3])
def test_a_sliding_window_of_held_tokens_is_the_kernels_local_window(padding):
    """A mask narrowed to the last 4 held tokens of each query (a sliding layer's):
    the kernel's window, which computes the same for a row padded on the left."""
    args = list(_decoder_inputs())
    args[3][1, :padding] = 0
    graph_module = _graph(_decoder(window=4), *args)
    sdpa = _anchor(graph_module, _aten.scaled_dot_product_attention.default)
    found = _assert_untouched_by_match(group_query_attention.match, graph_module, sdpa, CACHE_TARGET)
    assert isinstance(found, group_query_attention.GroupQueryAttentionMatch) and found.window == 4
    expected = graph_module(*args)
    context = DiagnosticContext("fx2onnx", "test", DiagnosticOptions())
    assert fuse_kernels(graph_module, FUSED_KERNELS_OPSET, context, True, CACHE_TARGET) == 1
    (call,) = _calls(graph_module, _fx2onnx.cached_attention.default)
    assert call.args[8:] == (1 / math.sqrt(8), 4, 2, 4)
    sees = args[3].cumsum(1)[:, -3:] > 0
    got = graph_module(*args)
    torch.testing.assert_close(got[0][sees], expected[0][sees])
    for present, want in zip(got[1:], expected[1:]):
        torch.testing.assert_close(present, want)


def test_held_tokens_counted_in_another_form_are_refused():
    """A count of held tokens that is not one window (`<=` here: the kernel's window is
    `<`) stays the standard Attention, with the reason."""
    graph_module = _graph(_decoder(window=4, window_compare=operator.le), *_decoder_inputs())
    sdpa = _anchor(graph_module, _aten.scaled_dot_product_attention.default)
    reason = "a mask that counts the held tokens otherwise than one sliding window"
    assert _assert_untouched_by_match(group_query_attention.match, graph_module, sdpa, CACHE_TARGET) == Refusal(reason)


def test_attention_over_a_cache_with_an_additive_mask_is_refused_and_becomes_the_standard_attention():
    graph_module = _graph(_decoder(additive=True), *_decoder_inputs())
    sdpa = _anchor(graph_module, _aten.scaled_dot_product_attention.default)
    reason = "an additive mask (a bias beside the causal mask: the kernel has none)"
    assert _assert_untouched_by_match(group_query_attention.match, graph_module, sdpa, CACHE_TARGET) == Refusal(reason)
    fused, notes = _fuse(graph_module, target=CACHE_TARGET)
    assert fused == 1 and notes == [f"`{sdpa.name}` (attention) fused as Attention, not GroupQueryAttention: {reason}."]
    assert len(_calls(graph_module, _fx2onnx.attention.default)) == 1 and not _calls(graph_module, _fx2onnx.cached_attention.default)


@pytest.mark.parametrize("target", [FusionTarget("standard", "attention_mask"), FusionTarget()], ids=["standard", "no_causal_mask"])
def test_attention_over_a_cache_is_not_matched_where_the_target_does_not_allow_the_kernel(target):
    graph_module = _graph(_decoder(), *_decoder_inputs())
    sdpa = _anchor(graph_module, _aten.scaled_dot_product_attention.default)
    assert _assert_untouched_by_match(group_query_attention.match, graph_module, sdpa, target) is None
    fused, notes = _fuse(graph_module, target=target)
    assert fused == 1 and notes == [] and _calls(graph_module, _fx2onnx.attention.default)


# -- attention with sinks over a cache (GroupQueryAttention with head_sink) -------------------------
def _sink_decoder(window: int | None = None, bias_of=lambda mask: (~mask).float() * torch.finfo(torch.float32).min):
    """:func:`_decoder`'s attention as transformers' gpt-oss writes it: scores, the mask as
    a bias (``bias_of`` the boolean mask), each head's sink joined before the softmax and
    dropped after it."""

    def decode(q, k, v, attention_mask, past_key, past_value, sinks):
        b, s, _ = q.shape
        query, key, value, mask = _heads_over_the_cache(q, k, v, attention_mask, past_key, past_value, window)
        scores = torch.matmul(query, _repeat_kv(key).transpose(2, 3)) * 8 ** -0.5 + bias_of(mask)
        logits = torch.cat([scores, sinks.reshape(1, -1, 1, 1).expand(b, -1, s, -1)], dim=-1)
        logits = logits - logits.max(dim=-1, keepdim=True).values
        weights = F.dropout(F.softmax(logits, dim=-1, dtype=logits.dtype)[..., :-1], p=0.0, training=False)
        return torch.matmul(weights, _repeat_kv(value)).transpose(1, 2).contiguous().reshape(b, s, 32), key, value

    return decode


@pytest.mark.parametrize("window", [None, 4])
def test_attention_with_sinks_over_a_cache_is_matched_and_replaced_by_group_query_attention(window):
    args = (*_decoder_inputs(), torch.randn(4) * 2)
    args[3][1, :3] = 0  # a row padded on the left
    graph_module = _graph(_sink_decoder(window), *args)
    graph_module.graph.eliminate_dead_code()  # max's unused indices, which the pipeline's graphs do not have
    softmax = _anchor(graph_module, _aten.softmax.int)
    found = _assert_untouched_by_match(attention_sinks.match, graph_module, softmax, CACHE_TARGET)
    assert isinstance(found, group_query_attention.GroupQueryAttentionMatch)
    assert found.sinks.name == "sinks" and found.window == window and found.anchor.target == _aten.dropout.default
    assert [past.name for past, _ in found.caches] == ["past_key", "past_value"] and found.operands.key.name == "cat"
    assert attention_sinks.match(softmax, FusionTarget("standard", "attention_mask")) is None
    expected = graph_module(*args)
    assert _fuse(graph_module, target=CACHE_TARGET) == (1, [])
    (call,) = _calls(graph_module, _fx2onnx.cached_attention.default)
    assert call.kwargs["sinks"].name == "sinks" and call.args[8:] == (8 ** -0.5, 4, 2, *([] if window is None else [window]))
    assert not {_aten.softmax.int, _aten.dropout.default, _aten.matmul.default} & {n.target for n in graph_module.graph.nodes}
    sees = args[3].cumsum(1)[:, -3:] > 0
    got = graph_module(*args)
    torch.testing.assert_close(got[0][sees], expected[0][sees])
    for present, want in zip(got[1:], expected[1:]):
        torch.testing.assert_close(present, want)


def test_attention_with_sinks_whose_mask_is_no_boolean_masks_bias_is_refused():
    graph_module = _graph(_sink_decoder(bias_of=lambda mask: torch.where(mask, 0.0, -1e4)), *_decoder_inputs(), torch.randn(4))
    softmax = _anchor(graph_module, _aten.softmax.int)
    reason = "attention with sinks whose mask is no boolean mask's bias (0 held, the dtype's lowest elsewhere)"
    assert _assert_untouched_by_match(attention_sinks.match, graph_module, softmax, CACHE_TARGET) == Refusal(reason)
    assert _assert_unchanged(graph_module, target=CACHE_TARGET) == [f"`{softmax.name}` (group_query_attention_sinks) kept unfused: {reason}."]


def test_a_softmax_without_sinks_is_not_matched():
    graph_module = _graph(lambda x: F.softmax(x, dim=-1), torch.randn(2, 4, 3, 5))
    assert attention_sinks.match(_anchor(graph_module, _aten.softmax.int), CACHE_TARGET) is None


# -- mixtures of experts (onnxruntime's MoE) ----------------------------------------------------------
def _experts_graph(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.fx.GraphModule, tuple[torch.Tensor, ...]]:
    """:func:`_graph` of a module with parameters, and the arguments its placeholders take."""
    program = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch"), 1: torch.export.Dim("tokens")},))
    graph_module = decompose_unsupported(program, program.graph_module, _registry()).graph_module
    remove_assertions(graph_module)
    remove_identity_views(graph_module)
    parameters = dict(model.named_parameters())
    return graph_module, (*(parameters[spec.target] for spec in program.graph_signature.input_specs if spec.target in parameters), x)


def _experts_sum(graph_module: torch.fx.GraphModule) -> torch.fx.Node:
    """The per-token sum of the experts' rows (the last sum over dim 1)."""
    return [n for n in graph_module.graph.nodes if n.target == _aten.sum.dim_IntList and n.args[1] == [1]][-1]


def test_experts_routed_by_a_softmax_top_k_are_matched_and_replaced():
    """gpt-oss's experts (the other families' routing and halves: test_fused_kernels.py's
    MoE attributes)."""
    from test_fused_kernels import Experts

    torch.manual_seed(0)
    graph_module, args = _experts_graph(Experts("gpt_oss"), torch.randn(3, 5, 32))
    anchor = _experts_sum(graph_module)
    found = _assert_untouched_by_match(mixture_of_experts.match, graph_module, anchor)
    assert isinstance(found, mixture_of_experts.MixtureOfExpertsMatch) and found.k == 2 and found.normalize
    assert found.activation == mixture_of_experts.Swiglu(True, 1.702, 1.0, 7.0)
    assert found.gate_up_bias is not None and found.logits.target == _aten.linear.default
    assert mixture_of_experts.match(anchor, FusionTarget("standard")) is None
    expected = graph_module(*args)
    assert _fuse(graph_module) == (1, [])
    (call,) = _calls(graph_module, _fx2onnx.mixture_of_experts.default)
    # the routing, the sort and the grouped products went with the sum
    gone = {_aten.topk.default, _aten.sort.default, _aten.histc.default, torch.ops.transformers.grouped_mm_fallback.default}
    assert not gone & {n.target for n in graph_module.graph.nodes}
    # float32 sums of products taken in another order: 3.1e-5 at outputs up to 60 (5e-7 relative)
    torch.testing.assert_close(graph_module(*args), expected, rtol=1e-5, atol=1e-4)


def test_experts_of_another_activation_are_refused_with_the_reason():
    from test_fused_kernels import Experts

    model = Experts("mixtral")
    model.block.experts.act_fn = torch.nn.Tanh()  # a gate no SwiGLU of the kernel computes
    graph_module, _ = _experts_graph(model, torch.randn(2, 3, 32))
    reason = "the experts' activation is no SwiGLU (silu(gate) * up, or gpt-oss's clamped one)"
    anchor = _experts_sum(graph_module)
    assert _assert_untouched_by_match(mixture_of_experts.match, graph_module, anchor) == Refusal(reason)
    assert _assert_unchanged(graph_module) == [f"`{anchor.name}` (mixture_of_experts) kept unfused: {reason}."]


def test_experts_in_bfloat16_are_refused_with_the_reason():
    from test_fused_kernels import Experts

    graph_module, _ = _experts_graph(Experts("gpt_oss").to(torch.bfloat16), torch.randn(2, 3, 32, dtype=torch.bfloat16))
    found = mixture_of_experts.match(_experts_sum(graph_module), FusionTarget())
    assert isinstance(found, Refusal) and found.reason.startswith("torch.bfloat16 tokens")
