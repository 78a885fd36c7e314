"""Order statistics along a dimension: ``cummax``/``cummin``, ``kthvalue``, ``mode`` and
``topk``.

``cummax``/``cummin`` compare every position with every earlier one (an ``L x L``
lower-triangular mask along the dimension, so memory grows with the square of its
length): the value is the running maximum (minimum) with NaN propagated, the index the
last position up to there holding that value, which is PyTorch's choice on ties and
NaN. ``kthvalue`` is ``TopK`` of the smallest ``k`` with NaN ordered last (among equal
values the first position is taken, where PyTorch's selection leaves it unspecified). ``mode``
counts, for each element, the equal elements of its slice: the value is the smallest
of the most frequent ones and the index its last position, as PyTorch gives for short
slices (for long ones PyTorch's unstable sort may report another position of the same
value; a NaN is taken as more frequent only when no number is as frequent, where
PyTorch's order of NaN is unspecified). ``topk`` takes a ``k`` known only at run time
(detectors keep ``min(1000, boxes over the threshold)``) as ``TopK``'s input.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import opset18 as op

from dispatcher._types import is_float_value
from dispatcher.function_table import FunctionTable
from dispatcher.traced_values import int64_vector, scalar_like
from onnxscript.function_libs.torch_lib.tensor_typing import INT64, TReal, TTensor

__all__ = ["ORDER_FUNCTIONS", "ORDER_DOMAIN"]

ORDER_DOMAIN = "pkg.fx2onnx.order"
_TABLE = FunctionTable(ORDER_DOMAIN)

ORDER_FUNCTIONS = _TABLE.entries

_order_op = _TABLE.op

_INT32 = ir.DataType.INT32.value
_INT64 = ir.DataType.INT64.value


def _of_a_scalar(x):
    """(value, index) of every order statistic of a 0-d tensor: itself, at index 0."""
    return op.Identity(x), op.Constant(value=ir.tensor(0, dtype=ir.DataType.INT64))


def _computable(x):
    """x in a type ONNX Runtime's reductions and TopK take (bool as int32), with the
    function turning results back."""
    if x.dtype == ir.DataType.BOOL:
        return op.Cast(x, to=_INT32), lambda v: op.Cast(v, to=ir.DataType.BOOL.value)
    return x, lambda v: v


def _same(a, b):
    """a == b, NaN equal to NaN."""
    equal = op.Equal(a, b)
    if is_float_value(a):
        equal = op.Or(equal, op.And(op.IsNaN(a), op.IsNaN(b)))
    return equal


def _pairs(x, dim: int):
    """Views of x for comparing position i (axis dim) with position j (axis dim + 1):
    (x_i, x_j, the 1-D positions, trailing axes after j)."""
    rank = len(x.shape)
    trailing = rank - dim - 1
    x_i = op.Unsqueeze(x, op.Constant(value_ints=[dim + 1]))
    x_j = op.Unsqueeze(x, op.Constant(value_ints=[dim]))
    length = op.Gather(op.Shape(x), op.Constant(value_int=dim), axis=0)
    positions = op.Range(op.Constant(value_int=0), length, op.Constant(value_int=1))
    return x_i, x_j, positions, trailing


def _trailing(value, trailing: int):
    """value with `trailing` axes of size 1 appended, so it broadcasts on the leading axes."""
    if trailing == 0:
        return value
    return op.Unsqueeze(value, op.Constant(value_ints=[-1 - i for i in range(trailing)]))


def _has_nan(values, axis: int, keepdims: int):
    mask = op.Cast(op.IsNaN(values), to=ir.DataType.FLOAT.value)
    return op.Greater(op.ReduceMax(mask, op.Constant(value_ints=[axis]), keepdims=keepdims), op.Constant(value_float=0.0))


def _cumulative(reduce_op, self, dim: int):
    if len(self.shape) == 0:
        return _of_a_scalar(self)
    dim = dim % len(self.shape)
    x, restore = _computable(self)
    x_i, x_j, positions, trailing = _pairs(x, dim)
    # earlier[i, j] = j <= i, on axes (dim, dim + 1)
    earlier = _trailing(op.LessOrEqual(op.Unsqueeze(positions, op.Constant(value_ints=[0])), op.Unsqueeze(positions, op.Constant(value_ints=[1]))), trailing)
    # Later positions stand in as x_i, which the window holds anyway.
    window = op.Where(earlier, x_j, x_i)
    axis = op.Constant(value_ints=[dim + 1])
    values = reduce_op(window, axis, keepdims=0)
    if is_float_value(x):
        values = op.Where(_has_nan(window, dim + 1, 0), scalar_like(float("nan"), x), values)
    # The last position up to i holding the running value.
    holds = op.And(earlier, _same(x_j, op.Unsqueeze(values, axis)))
    j = _trailing(positions, trailing)
    indices = op.ReduceMax(op.Where(holds, j, op.Constant(value_int=-1)), axis, keepdims=0)
    return restore(values), indices


@_order_op("aten::cummax")
def order_cummax(self: TTensor, dim: int) -> tuple[TTensor, INT64]:
    return _cumulative(op.ReduceMax, self, dim)


@_order_op("aten::cummin")
def order_cummin(self: TTensor, dim: int) -> tuple[TTensor, INT64]:
    return _cumulative(op.ReduceMin, self, dim)


@_order_op("aten::kthvalue")
def order_kthvalue(self: TReal, k: int, dim: int = -1, keepdim: bool = False) -> tuple[TReal, INT64]:
    if len(self.shape) == 0:
        return _of_a_scalar(self)
    x, restore = _computable(self)
    # NaN is larger than every number in PyTorch's order.
    key = op.Where(op.IsNaN(x), scalar_like(float("inf"), x), x) if is_float_value(x) else x
    _, smallest = op.TopK(key, op.Constant(value_ints=[k]), axis=dim, largest=False, sorted=True)
    index = op.Gather(smallest, op.Constant(value_ints=[k - 1]), axis=dim)
    values = op.GatherElements(x, index, axis=dim)
    if not keepdim:
        axes = op.Constant(value_ints=[dim])
        values, index = op.Squeeze(values, axes), op.Squeeze(index, axes)
    return restore(values), index


@_order_op("aten::topk")
def order_topk(self: TReal, k: INT64, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[TReal, INT64]:
    if len(self.shape) == 0:
        return _of_a_scalar(self)
    x, restore = _computable(self)
    values, indices = op.TopK(x, int64_vector([k]), axis=dim, largest=largest, sorted=sorted)
    return restore(values), indices


@_order_op("aten::mode")
def order_mode(self: TTensor, dim: int = -1, keepdim: bool = False) -> tuple[TTensor, INT64]:
    if len(self.shape) == 0:
        return _of_a_scalar(self)
    dim = dim % len(self.shape)
    x, restore = _computable(self)
    x_i, x_j, positions, trailing = _pairs(x, dim)
    counts = op.ReduceSum(op.Cast(_same(x_i, x_j), to=_INT64), op.Constant(value_ints=[dim + 1]), keepdims=0)
    axis = op.Constant(value_ints=[dim])
    most = op.Equal(counts, op.ReduceMax(counts, axis, keepdims=1))
    # The smallest of the most frequent values (others stand in as the slice's maximum).
    largest = op.ReduceMax(x, axis, keepdims=1)
    values = op.ReduceMin(op.Where(most, x, largest), axis, keepdims=1)
    if is_float_value(x):
        # A most frequent NaN wins only when no number is as frequent.
        numbers = op.And(most, op.Not(op.IsNaN(x)))
        any_number = op.Greater(op.ReduceMax(op.Cast(numbers, to=ir.DataType.FLOAT.value), axis, keepdims=1), op.Constant(value_float=0.0))
        number_min = op.ReduceMin(op.Where(numbers, x, scalar_like(float("inf"), x)), axis, keepdims=1)
        values = op.Where(any_number, number_min, scalar_like(float("nan"), x))
    j = _trailing(positions, trailing)
    index = op.ReduceMax(op.Where(_same(x, values), j, op.Constant(value_int=-1)), axis, keepdims=1)
    if not keepdim:
        values, index = op.Squeeze(values, axis), op.Squeeze(index, axis)
    return restore(values), index
