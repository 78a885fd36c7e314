"""Reductions torchlib has no function for: ``prims::prod``, ``nanmedian``, ``segment_reduce``,
and those whose torchlib function drops the rank PyTorch keeps without ``dim`` and with
``keepdim=True`` (``argmax``/``argmin`` of integers, ``mean``, ``linalg.vector_norm``).

``prims::prod`` appears when PyTorch's decomposition of ``cumprod`` (which torchlib does
not implement) multiplies a masked copy of its input along a new axis; ``linalg.vander``
and the masked cumulative product reach it the same way. ``nanmedian`` sorts each slice
with NaN last and takes the lower median of its numbers (``masked.median`` reaches it).
``segment_reduce`` reduces the segments given by lengths or offsets along an axis,
empty segments giving ``initial`` or the reduction's identity (NaN for a mean).

:data:`REDUCTION_FUNCTIONS` lists (qualified ATen names, function); the registry adds
them after torchlib's functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

import onnx_ir as ir
from onnxscript import opset18 as op

from dispatcher.function_table import FunctionTable
from dispatcher.traced_values import keep_rank_of, scalar_like
from onnxscript.function_libs.torch_lib.tensor_typing import INT64, TFloat, TInt, TReal, TTensor

__all__ = ["REDUCTION_FUNCTIONS", "REDUCTION_DOMAIN"]

REDUCTION_DOMAIN = "pkg.fx2onnx.reduction"
_TABLE = FunctionTable(REDUCTION_DOMAIN)

REDUCTION_FUNCTIONS = _TABLE.entries

_reduction_op = _TABLE.op



@_reduction_op("prims::prod")
def prims_prod(inp: TTensor, dims: Optional[Sequence[int]], output_dtype: Optional[int] = None) -> TTensor:
    # ReduceProd has no bool kernel: PyTorch multiplies bools as integers.
    values = op.Cast(inp, to=ir.DataType.INT64) if inp.dtype == ir.DataType.BOOL else inp
    if dims is None:
        result = op.ReduceProd(values, keepdims=0)
    elif len(dims) == 0:  # no dim: the product of each element alone
        result = op.Identity(values)
    else:
        result = op.ReduceProd(values, op.Constant(value_ints=list(dims)), keepdims=0)
    if output_dtype is not None and output_dtype != -1:
        result = op.Cast(result, to=output_dtype)
    return result


# -- every element, rank kept -------------------------------------------------------------
# PyTorch reduces every element when no dim is given and, with keepdim=True, keeps the
# input's rank (all sizes 1); torchlib's functions flatten first and give rank 1 or 0.


def _arg_of_integers(arg_op, x, dim: Optional[int], keepdim: bool):
    if len(x.shape) == 0:
        return op.Constant(value_int=0)
    if dim is None:
        flat = arg_op(op.Reshape(x, op.Constant(value_ints=[-1])), axis=0, keepdims=False)
        return keep_rank_of(x, flat, keepdim)
    return arg_op(x, axis=dim, keepdims=keepdim)


@_reduction_op("aten::argmax")
def argmax_of_integers(self: TInt, dim: Optional[int] = None, keepdim: bool = False) -> INT64:
    return _arg_of_integers(op.ArgMax, self, dim, keepdim)


@_reduction_op("aten::argmin")
def argmin_of_integers(self: TInt, dim: Optional[int] = None, keepdim: bool = False) -> INT64:
    return _arg_of_integers(op.ArgMin, self, dim, keepdim)


@_reduction_op("aten::mean.dim")
def mean_dim(self: TReal, dim: Optional[Sequence[int]] = None, keepdim: bool = False, dtype: int = -1) -> TReal:
    if len(self.shape) == 0:
        result = op.Identity(self)
    elif dim is None or len(dim) == 0:
        result = op.ReduceMean(self, keepdims=keepdim)
    else:
        result = op.ReduceMean(self, op.Constant(value_ints=list(dim)), keepdims=keepdim)
    if dtype is not None and dtype != -1:
        result = op.Cast(result, to=dtype)
    return result


@_reduction_op("aten::linalg_vector_norm")
def vector_norm(self: TFloat, ord: float = 2.0, dim: Optional[Sequence[int]] = None, keepdim: bool = False,
                dtype: int = -1) -> TFloat:
    if dtype is not None and dtype != -1:
        self = op.Cast(self, to=dtype)
    axes = None if dim is None or len(dim) == 0 else op.Constant(value_ints=list(dim))
    keep = keepdim if axes is not None else False
    values = op.Reshape(self, op.Constant(value_ints=[-1])) if axes is None else self
    if math.isinf(ord):
        reduce = op.ReduceMax if ord > 0 else op.ReduceMin
        result = reduce(op.Abs(values), axes, keepdims=keep)
    elif ord == 0.0:  # how many elements are not zero
        result = op.ReduceSum(op.CastLike(op.Cast(values, to=ir.DataType.BOOL.value), values), axes, keepdims=keep)
    elif ord == 1.0:
        result = op.ReduceL1(values, axes, keepdims=keep)
    elif ord == 2.0:
        result = op.ReduceL2(values, axes, keepdims=keep)
    else:
        magnitude = values if ord > 0 and ord % 2 == 0 else op.Abs(values)
        total = op.ReduceSum(op.Pow(magnitude, op.CastLike(ord, values)), axes, keepdims=keep)
        result = op.Pow(total, op.CastLike(1.0 / ord, values))
    return result if axes is not None or len(self.shape) == 0 else keep_rank_of(self, result, keepdim)


# -- nanmedian ---------------------------------------------------------------------------



def _nanmedian_along(x, dim: int, keepdim: bool):
    """The lower median of the numbers of each slice along ``dim`` and its index. A
    slice of NaN only gives NaN and the index of its first NaN (PyTorch's index there
    depends on its selection algorithm)."""
    axis = op.Constant(value_ints=[dim])
    size = op.Gather(op.Shape(x), axis)
    if x.dtype.is_floating_point():
        nan = op.IsNaN(x)
        # NaN sorts last; TopK keeps equal keys in index order
        key = op.Where(nan, scalar_like(float("inf"), x), x)
        numbers = op.ReduceSum(op.Cast(op.Not(nan), to=ir.DataType.INT64), axis, keepdims=1)
    else:
        key = x
        numbers = op.Expand(size, op.Shape(op.ReduceMax(x, axis, keepdims=1)))
    _, order = op.TopK(key, size, axis=dim, largest=False, sorted=True)
    one = op.Constant(value_int=1)
    position = op.Max(op.Div(op.Sub(numbers, one), op.Constant(value_int=2)), op.Constant(value_int=0))
    index = op.GatherElements(order, position, axis=dim)
    value = op.GatherElements(x, index, axis=dim)
    if not keepdim:
        value, index = op.Squeeze(value, axis), op.Squeeze(index, axis)
    return value, index


@_reduction_op("aten::nanmedian.dim")
def nanmedian_dim(self: TTensor, dim: int, keepdim: bool = False) -> tuple[TTensor, TTensor]:
    if len(self.shape) == 0:
        return op.Identity(self), op.Constant(value_int=0)
    return _nanmedian_along(self, dim, keepdim)


@_reduction_op("aten::nanmedian")
def nanmedian(self: TTensor) -> TTensor:
    value, _ = _nanmedian_along(op.Reshape(self, op.Constant(value_ints=[-1])), 0, False)
    return value


# -- segment_reduce ----------------------------------------------------------------------

_SEGMENT_REDUCE = {"sum": op.ReduceSum, "mean": op.ReduceSum, "prod": op.ReduceProd, "max": op.ReduceMax, "min": op.ReduceMin}
# what an element outside a segment counts as: the reduction's identity
_SEGMENT_FILL = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf")}


def _segment_reduce(data, reduce: str, offsets, axis: int, initial: Optional[float]):
    """Each segment ``[offsets[..., j], offsets[..., j+1])`` of ``data`` along ``axis``
    reduced: a (..., S, L) membership of positions in segments selects the elements."""
    rank = len(data.shape)
    axis = axis % rank
    inner = rank - axis - 1
    length = op.Gather(op.Shape(data), op.Constant(value_int=axis))
    positions = op.Range(op.Constant(value_int=0), length, op.Constant(value_int=1))  # (L,)
    last = op.Constant(value_ints=[-1])
    starts = op.Unsqueeze(op.Slice(offsets, op.Constant(value_ints=[0]), op.Constant(value_ints=[-1]), last), last)
    ends = op.Unsqueeze(op.Slice(offsets, op.Constant(value_ints=[1]), op.Constant(value_ints=[2**62]), last), last)
    member = op.And(op.LessOrEqual(starts, positions), op.Less(positions, ends))  # (..., S, L)
    trailing = op.Constant(value_ints=[-1 - i for i in range(inner)])
    if inner:
        member = op.Unsqueeze(member, trailing)
    values = op.Where(member, op.Unsqueeze(data, op.Constant(value_ints=[axis])), scalar_like(_SEGMENT_FILL[reduce], data))
    reduced_axis = op.Constant(value_ints=[axis + 1])
    result = _SEGMENT_REDUCE[reduce](values, reduced_axis, keepdims=0)
    start = None if initial is None else scalar_like(float(initial), data)
    if reduce == "mean":
        count = op.ReduceSum(op.CastLike(member, data), reduced_axis, keepdims=0)
        if start is not None:
            total = op.Add(result, start)
            return op.Where(op.Equal(count, scalar_like(0.0, count)), op.Expand(start, op.Shape(total)), op.Div(total, count))
        return op.Div(result, count)  # an empty segment is 0/0: NaN, as in PyTorch
    if start is None:
        return result
    combine = {"sum": op.Add, "prod": op.Mul, "max": op.Max, "min": op.Min}[reduce]
    return combine(result, start)


@_reduction_op("aten::segment_reduce")
def segment_reduce(
    data: TTensor,
    reduce: str,
    lengths: Optional[INT64] = None,
    indices: Optional[INT64] = None,
    offsets: Optional[INT64] = None,
    axis: int = 0,
    unsafe: bool = False,
    initial: Optional[float] = None,
) -> TTensor:
    if offsets is None:
        if lengths is None:
            raise NotImplementedError("segment_reduce needs lengths or offsets (indices are not supported by PyTorch either)")
        last = op.Constant(value_ints=[-1])
        ends = op.CumSum(op.Cast(lengths, to=ir.DataType.INT64), op.Constant(value_int=-1))
        zero = op.Expand(op.Constant(value_ints=[0]), op.Concat(op.Slice(op.Shape(ends), op.Constant(value_ints=[0]), last), op.Constant(value_ints=[1]), axis=0))
        offsets = op.Concat(zero, ends, axis=-1)
    return _segment_reduce(data, reduce, op.Cast(offsets, to=ir.DataType.INT64), axis, initial)


@_reduction_op("aten::histc")
def histc(self: TFloat, bins: int = 100, min: float = 0.0, max: float = 0.0) -> TFloat:
    """PyTorch's histogram of ``bins`` equal bins over [min, max]: with min == max (the
    default) over the input's own range, widened by 1 each side when every element is
    one value (a mixture of one expert counting its tokens). An element's bin is
    ``(x - min) * bins / (max - min)`` rounded down, the maximum in the last bin, as
    PyTorch's CPU kernel computes it; NaN and elements outside the range count nowhere."""
    flat = op.Reshape(self, op.Constant(value_ints=[-1]))
    if min == max:
        low, high = op.ReduceMin(flat, keepdims=0), op.ReduceMax(flat, keepdims=0)
        one = op.CastLike(op.Constant(value_float=1.0), flat)
        same = op.Equal(low, high)
        low, high = op.Where(same, op.Sub(low, one), low), op.Where(same, op.Add(high, one), high)
    else:
        low, high = op.CastLike(op.Constant(value_float=min), flat), op.CastLike(op.Constant(value_float=max), flat)
    inside = op.And(op.GreaterOrEqual(flat, low), op.LessOrEqual(flat, high))
    scaled = op.Div(op.Mul(op.Sub(flat, low), op.CastLike(op.Constant(value_float=float(bins)), flat)), op.Sub(high, low))
    last = op.Constant(value_int=bins - 1)
    position = op.Min(op.Cast(op.Floor(op.Where(inside, scaled, op.CastLike(op.Constant(value_float=-1.0), flat))),
                              to=ir.DataType.INT64), last)
    each_bin = op.Range(op.Constant(value_int=0), op.Constant(value_int=bins), op.Constant(value_int=1))
    hits = op.Equal(op.Unsqueeze(position, op.Constant(value_ints=[1])), op.Unsqueeze(each_bin, op.Constant(value_ints=[0])))
    counts = op.ReduceSum(op.Cast(hits, to=ir.DataType.FLOAT.value), op.Constant(value_ints=[0]), keepdims=0)
    return op.CastLike(counts, self)
