"""Selection and search operators torchlib has no function for: ``masked_select``,
``searchsorted``, ``index_reduce``.

``masked_select`` broadcasts input and mask and keeps the selected elements in row-major
order (ONNX ``Compress`` on both flattened). ``searchsorted`` counts, for each value, the
boundaries below it (``left``) or not above it (``right``): on a sorted sequence that
count is the insertion index PyTorch's binary search returns. ``index_reduce`` is a
``ScatterElements`` with the reduction of opset 18, after the positions the index
touches are reset to the reduction's identity when ``include_self=False``.

:data:`INDEXING_FUNCTIONS` lists (qualified ATen names, function); the registry adds
them after torchlib's functions.
"""

from __future__ import annotations

from typing import Optional

import onnx_ir as ir
from onnxscript import opset18 as op

from dispatcher.function_table import FunctionTable
from dispatcher.traced_values import scalar_like
from onnxscript.function_libs.torch_lib.tensor_typing import BOOL, INT64, TReal, TTensor

__all__ = ["INDEXING_FUNCTIONS", "INDEXING_DOMAIN"]

INDEXING_DOMAIN = "pkg.fx2onnx.indexing"
_TABLE = FunctionTable(INDEXING_DOMAIN)

INDEXING_FUNCTIONS = _TABLE.entries

_indexing_op = _TABLE.op



@_indexing_op("aten::masked_select")
def masked_select(self: TTensor, mask: BOOL) -> TTensor:
    # Expand is bidirectional: each side takes the shape both broadcast to.
    values = op.Expand(self, op.Shape(mask))
    selected = op.Expand(mask, op.Shape(values))
    flat = op.Constant(value_ints=[-1])
    return op.Compress(op.Reshape(values, flat), op.Reshape(selected, flat), axis=0)


# -- searchsorted ------------------------------------------------------------------------


def _insertion_index(boundaries, values, right: bool, side: Optional[str], sorter, out_int32: bool):
    if sorter is not None:
        boundaries = op.GatherElements(boundaries, sorter, axis=-1)
    if boundaries.dtype != values.dtype:  # compared in a type that holds both exactly
        boundaries = op.Cast(boundaries, to=ir.DataType.DOUBLE)
        values = op.Cast(values, to=ir.DataType.DOUBLE)
    to_right = side == "right" if side is not None else right
    last = op.Constant(value_ints=[-1])
    if len(boundaries.shape) > 1:  # one sorted row per row of values
        boundaries = op.Unsqueeze(boundaries, op.Constant(value_ints=[-2]))
    column = op.Unsqueeze(values, last)
    before = op.LessOrEqual(boundaries, column) if to_right else op.Less(boundaries, column)
    count = op.ReduceSum(op.Cast(before, to=ir.DataType.INT64), last, keepdims=0)
    return op.Cast(count, to=ir.DataType.INT32) if out_int32 else count


@_indexing_op("aten::searchsorted.Tensor")
def searchsorted_tensor(
    sorted_sequence: TReal,
    self: TReal,
    out_int32: bool = False,
    right: bool = False,
    side: Optional[str] = None,
    sorter: Optional[INT64] = None,
) -> INT64:
    return _insertion_index(sorted_sequence, self, right, side, sorter, out_int32)


@_indexing_op("aten::searchsorted.Scalar")
def searchsorted_scalar(
    sorted_sequence: TReal,
    self: float,
    out_int32: bool = False,
    right: bool = False,
    side: Optional[str] = None,
    sorter: Optional[INT64] = None,
) -> INT64:
    if isinstance(self, float) and not sorted_sequence.dtype.is_floating_point():
        value = op.Constant(value_float=self)
    else:
        value = scalar_like(float(self), sorted_sequence)
    return _insertion_index(sorted_sequence, value, right, side, sorter, out_int32)


# -- index_reduce ------------------------------------------------------------------------

_SCATTER_REDUCTION = {"prod": "mul", "amax": "max", "amin": "min", "mean": "add"}


def _floor_divide(a, b):
    """Integer division rounding toward -inf, as PyTorch's mean of integers does (ONNX
    ``Div`` of integers truncates)."""
    quotient = op.Div(a, b)
    zero = op.CastLike(op.Constant(value_int=0), a)
    inexact = op.Not(op.Equal(op.Mul(quotient, b), a))
    signs_differ = op.Xor(op.Less(a, zero), op.Less(b, zero))
    return op.Where(op.And(inexact, signs_differ), op.Sub(quotient, op.CastLike(op.Constant(value_int=1), a)), quotient)


def _index_reduce(self, dim: int, index, source, reduce: str, include_self: bool):
    rank = len(self.shape)
    dim = dim % rank
    view = [1] * rank
    view[dim] = -1
    # ScatterElements wants one index per source element
    indices = op.Expand(op.Reshape(index, op.Constant(value_ints=view)), op.Shape(source))
    base = self
    if not include_self:
        if reduce in ("amax", "amin"):
            # a source value in each position the index touches: the reduction then
            # sees the source values only (whatever the dtype's range)
            base = op.ScatterElements(self, indices, source, axis=dim)
        else:
            identity = op.CastLike(op.Constant(value_int=1 if reduce == "prod" else 0), self)
            base = op.ScatterElements(self, indices, op.Expand(identity, op.Shape(source)), axis=dim)
    result = op.ScatterElements(base, indices, source, axis=dim, reduction=_SCATTER_REDUCTION[reduce])
    if reduce != "mean":
        return result
    one, zero = op.CastLike(op.Constant(value_int=1), self), op.CastLike(op.Constant(value_int=0), self)
    start = op.Expand(one if include_self else zero, op.Shape(self))
    counts = op.ScatterElements(start, indices, op.Expand(one, op.Shape(source)), axis=dim, reduction="add")
    counts = op.Where(op.Equal(counts, zero), one, counts)  # untouched positions keep their value
    if self.dtype.is_floating_point():
        return op.Div(result, counts)
    return _floor_divide(result, counts)


@_indexing_op("aten::index_reduce")
def index_reduce(
    self: TReal, dim: int, index: INT64, source: TReal, reduce: str, include_self: bool = True
) -> TReal:
    if len(self.shape) == 0:  # a 0-d self and source: one element along a dim of size 1
        one = op.Constant(value_ints=[1])
        result = _index_reduce(op.Reshape(self, one), 0, index, op.Reshape(source, one), reduce, include_self)
        return op.Reshape(result, op.Constant(value_ints=[]))
    return _index_reduce(self, dim, index, source, reduce, include_self)
