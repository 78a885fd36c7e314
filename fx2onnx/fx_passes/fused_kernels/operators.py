"""The operators the fused-kernel rules put in the FX graph (``torch.ops.fx2onnx.*``),
each with PyTorch semantics equal to the ONNX kernel it becomes
(``dispatcher/functions/fused.py``) and a fake implementation for shapes.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("fx2onnx::attention", mutates_args=())
def attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float, is_causal: bool
) -> torch.Tensor:
    """Scaled-dot-product attention with ``key``/``value`` heads shared by groups of
    consecutive query heads (ONNX ``Attention``'s semantics)."""
    groups = query.shape[-3] // key.shape[-3]
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=groups != 1
    )


@attention.register_fake
def _attention_fake(query, key, value, mask, scale, is_causal):
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


@torch.library.custom_op("fx2onnx::attention_3d", mutates_args=())
def attention_3d(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float, is_causal: bool,
    query_heads: int, key_heads: int,
) -> torch.Tensor:
    """:func:`attention` of (B, S, heads * D) tensors, the heads side by side in the last dim."""

    def split(x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.unflatten(-1, (heads, -1)).transpose(1, 2)

    result = attention(split(query, query_heads), split(key, key_heads), split(value, key_heads), mask, scale, is_causal)
    return result.transpose(1, 2).flatten(-2)


@attention_3d.register_fake
def _attention_3d_fake(query, key, value, mask, scale, is_causal, query_heads, key_heads):
    return query.new_empty((*query.shape[:-1], value.shape[-1] * query_heads // key_heads))


@torch.library.custom_op("fx2onnx::multi_head_attention", mutates_args=())
def multi_head_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float, heads: int,
) -> torch.Tensor:
    """:func:`attention_3d` with as many key/value heads as query heads, not causal
    (onnxruntime's ``MultiHeadAttention``; a query whose boolean mask holds no key gives 0)."""
    return attention_3d(query, key, value, mask, scale, False, heads, heads)


@multi_head_attention.register_fake
def _multi_head_attention_fake(query, key, value, mask, scale, heads):
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


@torch.library.custom_op("fx2onnx::rotary", mutates_args=())
def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """Rotary embedding of ``x`` (B, heads, S, D) by the half tables ``cos``/``sin``
    (B, S, D/2): the halves ``x1, x2`` become ``x1 cos - x2 sin, x2 cos + x1 sin``
    (ONNX ``RotaryEmbedding``'s semantics); ``interleaved``: the pairs ``(x[2i], x[2i+1])``
    rotate instead, by entry ``i`` of the tables (its ``interleaved=1``)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    if interleaved:
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)
    first, second = x.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


@rotary.register_fake
def _rotary_fake(x, cos, sin, interleaved=False):
    return torch.empty_like(x)


@torch.library.custom_op("fx2onnx::gelu", mutates_args=())
def gelu(x: torch.Tensor, approximate: str) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate=approximate)


@gelu.register_fake
def _gelu_fake(x, approximate):
    return torch.empty_like(x)


@torch.library.custom_op("fx2onnx::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float, trailing_dims: int) -> torch.Tensor:
    """RMS normalization over the last ``trailing_dims`` dims, computed in float32 and cast
    back before the scale (ONNX ``RMSNormalization`` with ``stash_type`` float32)."""
    computed = x.float()
    dims = list(range(-trailing_dims, 0))
    normalized = computed * torch.rsqrt(computed.pow(2).mean(dims, keepdim=True) + eps)
    return scale * normalized.to(x.dtype)


@rms_norm.register_fake
def _rms_norm_fake(x, scale, eps, trailing_dims):
    return torch.empty_like(x)


@torch.library.custom_op("fx2onnx::rotary_3d", mutates_args=())
def rotary_3d(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, interleaved: bool = False) -> torch.Tensor:
    """:func:`rotary` of ``x`` (B, S, heads * D), the heads side by side in the last dim."""
    split = x.unflatten(-1, (heads, -1)).transpose(1, 2)
    return rotary(split, cos, sin, interleaved).transpose(1, 2).flatten(-2)


@rotary_3d.register_fake
def _rotary_3d_fake(x, cos, sin, heads, interleaved=False):
    return torch.empty_like(x)


@torch.library.custom_op("fx2onnx::cached_attention", mutates_args=())
def cached_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_key: torch.Tensor, past_value: torch.Tensor,
    seqlens_k: torch.Tensor, total_length: torch.Tensor, bias: torch.Tensor, scale: float, query_heads: int, key_heads: int,
    window: int = -1, sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal attention of new tokens over a cache (onnxruntime's ``GroupQueryAttention``).

    ``query`` (B, S, query_heads * D), ``key``/``value`` (B, S, key_heads * D) are the new
    tokens; ``past_key``/``past_value`` (B, key_heads, P, D) the cache. Returns the
    attention (B, S, query_heads * D) and the caches with the new tokens appended. Sequence
    b holds ``seqlens_k[b] + 1`` tokens in all (``total_length`` at most), the new ones
    last: its query i sits at position ``seqlens_k[b] + 1 - S + i`` and sees the keys up
    to it, ``bias`` (B, 1, S, total) added to its scores (the padding's keys masked);
    with a ``window`` (not -1), only the keys of the last ``window`` positions up to it
    (the kernel's ``local_window_size``, counted in cache slots). ``sinks`` (query_heads,):
    each head's sink logit, a score beside the keys' in the softmax that weighs no value
    (the kernel's ``head_sink``, gpt-oss's attention sinks).
    """

    def split(x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.unflatten(-1, (heads, -1)).transpose(1, 2)

    present_key = torch.cat([past_key, split(key, key_heads)], dim=2)
    present_value = torch.cat([past_value, split(value, key_heads)], dim=2)
    new, total = query.shape[1], present_key.shape[2]
    last_seen = (seqlens_k.long() + 1 - new).view(-1, 1, 1) + torch.arange(new).view(1, -1, 1)
    visible = torch.arange(total).view(1, 1, -1) <= last_seen  # (B, S, total)
    if window != -1:
        visible = visible & (last_seen - torch.arange(total).view(1, 1, -1) < window)
    scores_added = torch.where(visible.unsqueeze(1), bias, float("-inf"))
    if sinks is not None:
        result = _attention_with_sinks(split(query, query_heads), present_key, present_value, scores_added, scale, sinks)
        return result.transpose(1, 2).flatten(-2), present_key, present_value
    result = torch.nn.functional.scaled_dot_product_attention(
        split(query, query_heads), present_key, present_value, attn_mask=scores_added, scale=scale,
        enable_gqa=query_heads != key_heads,
    )
    return result.transpose(1, 2).flatten(-2), present_key, present_value


def _attention_with_sinks(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor, scale: float,
                          sinks: torch.Tensor) -> torch.Tensor:
    """Attention whose softmax has one more logit per head, ``sinks``, that weighs no value."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = query @ key.transpose(-2, -1) * scale + bias
    sink_column = sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1).to(scores.dtype)
    weights = torch.softmax(torch.cat([scores, sink_column], -1), dim=-1)[..., :-1]
    return weights @ value


@cached_attention.register_fake
def _cached_attention_fake(query, key, value, past_key, past_value, seqlens_k, total_length, bias, scale, query_heads, key_heads,
                           window=-1, sinks=None):
    batch, new = query.shape[0], query.shape[1]
    head_size = past_key.shape[-1]
    present = past_key.new_empty((batch, key_heads, past_key.shape[2] + new, head_size))
    return query.new_empty(query.shape), present, past_value.new_empty(present.shape)


@torch.library.custom_op("fx2onnx::mixture_of_experts", mutates_args=())
def mixture_of_experts(
    x: torch.Tensor, router_logits: torch.Tensor, gate_up: torch.Tensor, gate_up_bias: torch.Tensor | None,
    down: torch.Tensor, down_bias: torch.Tensor | None, k: int, normalize: bool, alpha: float = 1.0, beta: float = 0.0,
    limit: float | None = None,
) -> torch.Tensor:
    """Each token's ``k`` experts of highest ``softmax(router_logits)`` (T, E), their
    outputs summed by those probabilities (renormalized over the ``k`` with ``normalize``):
    onnxruntime's ``MoE`` with a SwiGLU of interleaved gate and up rows.

    ``x`` (T, H); ``gate_up`` (E, 2I, H) gives each expert's gate and up rows in turn
    (``g0, u0, g1, u1, ...``), ``down`` (E, H, I); the biases (E, 2I) and (E, H) or None.
    An expert computes ``down @ (g * sigmoid(alpha * g) * (u + beta))`` with ``g`` clamped
    below ``limit`` and ``u`` within ``±limit`` (None: no clamp).
    """
    probabilities = torch.softmax(router_logits.float(), dim=-1)
    weights, chosen = torch.topk(probabilities, k, dim=-1)  # (T, k)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    hidden = torch.einsum("th,tknh->tkn", x, gate_up[chosen])
    if gate_up_bias is not None:
        hidden = hidden + gate_up_bias[chosen]
    gate, up = hidden[..., ::2], hidden[..., 1::2]
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
    out = torch.einsum("tki,tkhi->tkh", gate * torch.sigmoid(alpha * gate) * (up + beta), down[chosen])
    if down_bias is not None:
        out = out + down_bias[chosen]
    return (out * weights.to(out.dtype)[..., None]).sum(dim=1).to(x.dtype)


@mixture_of_experts.register_fake
def _mixture_of_experts_fake(x, router_logits, gate_up, gate_up_bias, down, down_bias, k, normalize, alpha=1.0, beta=0.0,
                             limit=None):
    return torch.empty_like(x)


# Operators whose ONNX kernel is onnxruntime's own: ONNX's shape inference has no schema of
# it, so inside a model-local function the types of its outputs, and of all that reads them,
# would be unknown to a checker. The module calls around them stay in the main graph,
# where every value's type is declared.
ONNXRUNTIME_KERNELS = frozenset({torch.ops.fx2onnx.cached_attention.default, torch.ops.fx2onnx.mixture_of_experts.default})


@torch.library.custom_op("fx2onnx::weight_only_linear", mutates_args=())
def weight_only_linear(
    x: torch.Tensor, qdata: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, bias: torch.Tensor | None,
    group_size: int, bits: int,
) -> torch.Tensor:
    """``linear(x, W, bias)`` with ``W = (qdata - zero_point) * scale`` dequantized in groups
    of ``group_size`` consecutive input features of each output row (``qdata`` (N, K)
    integers, ``scale`` and ``zero_point`` (N, K / group_size)): the semantics of
    onnxruntime's ``MatMulNBits`` (and of torchao's weight-only ``dequantize_affine``);
    ``bits`` (4 or 8) is the range the integers are in."""
    integers = qdata.to(torch.float32)
    if zero_point is not None:
        integers = integers - zero_point.to(torch.float32).repeat_interleave(group_size, dim=1)
    weight = (integers * scale.to(torch.float32).repeat_interleave(group_size, dim=1)).to(x.dtype)
    return torch.nn.functional.linear(x, weight, bias)


@weight_only_linear.register_fake
def _weight_only_linear_fake(x, qdata, scale, zero_point, bias, group_size, bits):
    return x.new_empty((*x.shape[:-1], qdata.shape[0]))
