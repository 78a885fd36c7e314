"""Scaled-dot-product attention in standard operators, with no ``IsNaN``.

Where no fused kernel takes ``aten::scaled_dot_product_attention`` (the portable target,
``--runtime standard`` below and beside the fused rules), it is written out as products
and a softmax. PyTorch gives 0 for a query whose boolean mask holds no key; a softmax over
a row of ``-inf`` gives NaN, which torchlib's form then replaces from ``IsNaN``, an
operator some runtimes lack (onnxruntime-web's WebGPU). Here the masked scores are the
dtype's lowest finite number instead, so no row can make NaN, and the weights are taken
through the mask once more: a row with a key keeps them unchanged (its masked weights are
exactly 0 already: the exponential of lowest - max underflows), a row with none (whose
softmax is uniform) gets 0, PyTorch's result.

A float (additive) mask is added to the scores, as PyTorch does.
"""

from __future__ import annotations

from typing import Optional

import onnx_ir as ir
from onnxscript import opset18 as op

from dispatcher.function_table import FunctionTable
from onnxscript.function_libs.torch_lib.tensor_typing import TFloat
from onnxscript.onnx_types import TensorType

__all__ = ["DOT_PRODUCT_ATTENTION_FUNCTIONS", "DOT_PRODUCT_ATTENTION_DOMAIN"]

DOT_PRODUCT_ATTENTION_DOMAIN = "pkg.fx2onnx.dot_product_attention"
_TABLE = FunctionTable(DOT_PRODUCT_ATTENTION_DOMAIN)

DOT_PRODUCT_ATTENTION_FUNCTIONS = _TABLE.entries

_BOOL = ir.DataType.BOOL.value


def _constant(value: float, dtype: ir.DataType):
    return op.Constant(value=ir.tensor(value, dtype=dtype))


def _dim(x, axis: int):
    """The size of ``x`` along ``axis`` as a 1-D int64 tensor."""
    return op.Shape(x, start=axis, end=axis + 1 if axis != -1 else None)


def _scale(query, scale: Optional[float]):
    """The factor of the scores: ``scale``, or 1/sqrt(head size) (read at run time when symbolic)."""
    if scale is not None:
        return _constant(float(scale), query.dtype)
    head_size = query.shape[-1] if query.shape is not None else None
    if isinstance(head_size, int):
        return _constant(head_size ** -0.5, query.dtype)
    return op.Reciprocal(op.Sqrt(op.CastLike(_dim(query, -1), query)))


def _causal_mask(query, key):
    """(L, S) boolean, True on and below the diagonal: PyTorch's ``is_causal``."""
    ones = op.Expand(op.Constant(value_float=1.0), op.Concat(_dim(query, -2), _dim(key, -2), axis=0))
    return op.Cast(op.Trilu(ones, upper=0), to=_BOOL)


def _repeated_heads(x, groups: int, heads: int):
    """(B, heads / groups, S, D) with each head repeated ``groups`` times in a row: (B, heads, S, D)."""
    repeated = op.Expand(op.Unsqueeze(x, op.Constant(value_ints=[2])), op.Constant(value_ints=[1, 1, groups, 1, 1]))
    shape = op.Concat(_dim(x, 0), op.Constant(value_ints=[heads, -1]), _dim(x, -1), axis=0)
    return op.Reshape(repeated, shape)


@_TABLE.op("aten::scaled_dot_product_attention")
def scaled_dot_product_attention(
    query: TFloat,
    key: TFloat,
    value: TFloat,
    attn_mask: Optional[TensorType] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> TFloat:
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention takes is_causal or attn_mask, not both")
    if len(query.shape) != 4 or len(key.shape) != 4 or len(value.shape) != 4:
        raise ValueError("scaled_dot_product_attention is exported for 4-D query, key and value only")
    query_heads, key_heads = query.shape[1], key.shape[1]
    if enable_gqa and query_heads != key_heads:
        if not isinstance(query_heads, int) or not isinstance(key_heads, int):
            raise ValueError("grouped-query attention (enable_gqa) needs static head counts to repeat key and value")
        groups = query_heads // key_heads
        key, value = _repeated_heads(key, groups, query_heads), _repeated_heads(value, groups, query_heads)
    scores = op.MatMul(op.Mul(query, _scale(query, scale)), op.Transpose(key, perm=[0, 1, 3, 2]))
    mask = _causal_mask(query, key) if is_causal else attn_mask
    if mask is None:
        weights = op.Softmax(scores, axis=-1)
    elif mask.dtype == ir.DataType.BOOL:
        lowest = _constant(query.dtype.min, query.dtype)
        # lowest, not -inf: no row's softmax is NaN; the second Where zeroes the rows with no key
        weights = op.Where(mask, op.Softmax(op.Where(mask, scores, lowest), axis=-1), _constant(0.0, query.dtype))
    else:
        weights = op.Softmax(op.Add(scores, mask), axis=-1)
    if dropout_p != 0:
        weights, _ = op.Dropout(weights, dropout_p)
    return op.MatMul(weights, value)
