"""The fused kernels the FX rules chose (``fx2onnx/fx_passes/fused_kernels/``).

Each ``torch.ops.fx2onnx.*`` operator becomes one ONNX kernel. The model is built at
torchlib's opset and converted to the opset asked for afterwards, and the kernels are
newer than the one it is built at: they are written in :data:`STANDARD_LATER_DOMAIN`,
with the standard operator's name, inputs and attributes, and moved into the standard
domain once the opset is final (``fx2onnx/onnx_passes/fused_kernel_domain.py``).
onnxruntime's own kernels (``ExportOptions(runtime="onnxruntime")``) are written in its domain,
:data:`ONNXRUNTIME_DOMAIN`, which no opset conversion touches.
"""

from __future__ import annotations

from typing import Any, Optional

import onnx_ir as ir
from onnxscript import opset18 as op
from onnxscript import values as osv

from dispatcher.function_table import FunctionTable

__all__ = ["FUSED_FUNCTIONS", "FUSED_DOMAIN", "ONNXRUNTIME_DOMAIN", "STANDARD_LATER_DOMAIN"]

FUSED_DOMAIN = "pkg.fx2onnx.fused"
# Standard operators of an opset newer than the one the model is built at.
STANDARD_LATER_DOMAIN = "pkg.fx2onnx.standard_later"
ONNXRUNTIME_DOMAIN = "com.microsoft"  # onnxruntime's contrib operators

_TABLE = FunctionTable(FUSED_DOMAIN)
FUSED_FUNCTIONS = _TABLE.entries


def _standard(op_type: str) -> osv.Op:
    """A standard operator in the domain it waits in (no schema there: inputs are
    positional, attributes keywords)."""
    return osv.Op(osv.Opset(STANDARD_LATER_DOMAIN, 1), op_type)


_attention, _rotary_embedding, _gelu = _standard("Attention"), _standard("RotaryEmbedding"), _standard("Gelu")
_rms_normalization = _standard("RMSNormalization")
_group_query_attention = osv.Op(osv.Opset(ONNXRUNTIME_DOMAIN, 1), "GroupQueryAttention")
_multi_head_attention = osv.Op(osv.Opset(ONNXRUNTIME_DOMAIN, 1), "MultiHeadAttention")
_mixture_of_experts = osv.Op(osv.Opset(ONNXRUNTIME_DOMAIN, 1), "MoE")

_FLOAT = 1  # ONNX's FLOAT: the type RMSNormalization computes in


def _with_mask(query: Any, key: Any, value: Any, mask: Any) -> tuple[Any, ...]:
    return (query, key, value) if mask is None else (query, key, value, mask)


@_TABLE.op("fx2onnx::attention")
def attention(query: Any, key: Any, value: Any, mask: Optional[Any] = None, scale: float = 1.0, is_causal: bool = False) -> Any:
    # 4-D query, key and value: the kernel takes the head counts from their shapes
    return _attention(*_with_mask(query, key, value, mask), scale=scale, is_causal=int(is_causal))


@_TABLE.op("fx2onnx::attention_3d")
def attention_3d(
    query: Any, key: Any, value: Any, mask: Optional[Any] = None, scale: float = 1.0, is_causal: bool = False,
    query_heads: int = 1, key_heads: int = 1,
) -> Any:
    # (B, S, heads * D) inputs: the kernel needs the head counts
    return _attention(
        *_with_mask(query, key, value, mask), scale=scale, is_causal=int(is_causal),
        q_num_heads=query_heads, kv_num_heads=key_heads,
    )


@_TABLE.op("fx2onnx::multi_head_attention")
def multi_head_attention(query: Any, key: Any, value: Any, mask: Optional[Any] = None, scale: float = 1.0, heads: int = 1) -> Any:
    # (B, S, heads * D) inputs, a (B or 1, 1, L, S) mask taken as the kernel's additive
    # `attention_bias` (it has no boolean mask of that shape)
    if mask is None:
        return _multi_head_attention(query, key, value, num_heads=heads, scale=scale)
    if mask.dtype != ir.DataType.BOOL:
        return _multi_head_attention(query, key, value, None, None, mask, num_heads=heads, scale=scale)
    # the lowest finite number where masked, not -inf: no row can make NaN; a query with
    # no key (a uniform softmax) gets 0, as in PyTorch, from the mask's row
    bias = op.Where(mask, op.Constant(value=ir.tensor(0.0, dtype=query.dtype)),
                    op.Constant(value=ir.tensor(query.dtype.min, dtype=query.dtype)))
    attended = _multi_head_attention(query, key, value, None, None, bias, num_heads=heads, scale=scale)
    holds_key = op.ReduceMax(op.Cast(mask, to=int(query.dtype)), op.Constant(value_ints=[-1]), keepdims=1)
    return op.Mul(attended, op.Squeeze(holds_key, op.Constant(value_ints=[1])))


@_TABLE.op("fx2onnx::rotary")
def rotary(x: Any, cos: Any, sin: Any, interleaved: bool = False) -> Any:
    # 4-D x (B, heads, S, D) with (B, S, D/2) tables: no position ids; halves, or pairs when interleaved
    return _rotary_embedding(x, cos, sin, interleaved=int(interleaved))


@_TABLE.op("fx2onnx::rotary_3d")
def rotary_3d(x: Any, cos: Any, sin: Any, heads: int = 1, interleaved: bool = False) -> Any:
    # x (B, S, heads * D): the kernel needs the head count to split the last dim
    return _rotary_embedding(x, cos, sin, num_heads=heads, interleaved=int(interleaved))


def _head_sink(sinks: Any) -> tuple[Any, ...]:
    """GroupQueryAttention's `head_sink` input, when the attention has sinks (no empty input otherwise)."""
    return () if sinks is None else (sinks,)


@_TABLE.op("fx2onnx::cached_attention")
def cached_attention(
    query: Any, key: Any, value: Any, past_key: Any, past_value: Any, seqlens_k: Any, total_length: Any, bias: Any,
    scale: float = 1.0, query_heads: int = 1, key_heads: int = 1, window: int = -1, sinks: Optional[Any] = None,
) -> Any:
    # past and present may be one buffer (the runtime's choice): the kernel then writes the
    # new tokens in place, at each sequence's length. No rotary tables or position ids
    # (the rotations are the graph's); the bias is the kernel's `attention_bias` input; a
    # sliding layer's window (-1: none) is its `local_window_size`; attention sinks its
    # `head_sink` input.
    return _group_query_attention(
        query, key, value, past_key, past_value, seqlens_k, total_length, None, None, None, bias, *_head_sink(sinks),
        num_heads=query_heads, kv_num_heads=key_heads, scale=scale, _num_outputs=3,
        **({} if window == -1 else {"local_window_size": window}),
    )


@_TABLE.op("fx2onnx::mixture_of_experts")
def mixture_of_experts(
    x: Any, router_logits: Any, gate_up: Any, gate_up_bias: Optional[Any], down: Any, down_bias: Optional[Any], k: int = 1,
    normalize: bool = True, alpha: float = 1.0, beta: float = 0.0, limit: Optional[float] = None,
) -> Any:
    # the kernel routes by the logits itself (softmax, top k, renormalized with
    # normalize_routing_weights); its SwiGLU reads gate and up rows interleaved
    # (swiglu_fusion 1, the one layout its CPU kernel takes); no limit: no clamp
    routed = _mixture_of_experts(
        x, router_logits, gate_up, gate_up_bias, down, down_bias,
        k=k, normalize_routing_weights=1, activation_type="swiglu", swiglu_fusion=1,
        activation_alpha=alpha, activation_beta=beta, **({} if limit is None else {"swiglu_limit": limit}),
    )
    if normalize:
        return routed
    # weights not renormalized: the renormalized sum times the top k's share of the softmax
    # (onnxruntime 1.30's CPU kernel, Transformers.js's, returns zeros for
    # normalize_routing_weights=0 between two nodes of a graph; the renormalized one is
    # right in every version). The softmax in float32, as the kernel's and transformers'.
    probs = op.Softmax(op.Cast(router_logits, to=_FLOAT), axis=-1)
    top, _ = op.TopK(probs, op.Constant(value_ints=[k]), axis=-1)
    return op.Mul(routed, op.CastLike(op.ReduceSum(top, op.Constant(value_ints=[-1]), keepdims=1), routed))


@_TABLE.op("fx2onnx::gelu")
def gelu(x: Any, approximate: str = "none") -> Any:
    return _gelu(x, approximate=approximate)


@_TABLE.op("fx2onnx::rms_norm")
def rms_norm(x: Any, scale: Any, eps: float = 1e-6, trailing_dims: int = 1) -> Any:
    return _rms_normalization(x, scale, axis=-trailing_dims, epsilon=eps, stash_type=_FLOAT)
