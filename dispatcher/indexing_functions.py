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

from onnxscript import opset18 as op

from dispatcher.function_table import FunctionTable
from onnxscript.function_libs.torch_lib.tensor_typing import BOOL, INT64, TReal, TTensor

__all__ = ["INDEXING_FUNCTIONS", "INDEXING_DOMAIN"]

INDEXING_DOMAIN = "pkg.fx2onnx.indexing"
_TABLE = FunctionTable(INDEXING_DOMAIN)

INDEXING_FUNCTIONS = _TABLE.entries

_indexing_op = _TABLE.op

_FLOAT = 1
_INT32 = 6
_INT64 = 7
_BOOL = 9
_DOUBLE = 11
_FLOATING = (1, 10, 11, 16)  # FLOAT, FLOAT16, DOUBLE, BFLOAT16


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
        boundaries = op.Cast(boundaries, to=_DOUBLE)
        values = op.Cast(values, to=_DOUBLE)
    to_right = side == "right" if side is not None else right
    last = op.Constant(value_ints=[-1])
    if len(boundaries.shape) > 1:  # one sorted row per row of values
        boundaries = op.Unsqueeze(boundaries, op.Constant(value_ints=[-2]))
    column = op.Unsqueeze(values, last)
    before = op.LessOrEqual(boundaries, column) if to_right else op.Less(boundaries, column)
    count = op.ReduceSum(op.Cast(before, to=_INT64), last, keepdims=0)
    return op.Cast(count, to=_INT32) if out_int32 else count


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
    if isinstance(self, float) and sorted_sequence.dtype not in _FLOATING:
        value = op.Constant(value_float=self)
    else:
        value = op.CastLike(op.Constant(value_float=float(self)), sorted_sequence)
    return _insertion_index(sorted_sequence, value, right, side, sorter, out_int32)
