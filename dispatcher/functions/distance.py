"""Pairwise distances: ``aten::_cdist_forward`` (what ``torch.cdist`` calls).

Rows of ``x1`` (..., P, M) against rows of ``x2`` (..., R, M), batch dims broadcast.
The p-norm of each difference: a count of nonzero components for p=0, the largest
magnitude for p=inf, ``(sum |d|^p)^(1/p)`` otherwise. For p=2 PyTorch switches to the
matrix-product form ``|a|^2 + |b|^2 - 2 a.b`` when ``compute_mode`` asks for it (1) or
allows it (None/0) and either side has more than 25 rows; the same choice is made here
so that results agree with PyTorch's rounding.

:data:`DISTANCE_FUNCTIONS` lists (qualified ATen names, function); the registry adds
them after torchlib's functions.
"""

from __future__ import annotations

import math
from typing import Optional

from onnxscript import opset18 as op

from dispatcher.function_table import FunctionTable
from dispatcher.traced_values import scalar_like
from onnxscript.function_libs.torch_lib.tensor_typing import TFloat

__all__ = ["DISTANCE_FUNCTIONS", "DISTANCE_DOMAIN"]

DISTANCE_DOMAIN = "pkg.fx2onnx.distance"
_TABLE = FunctionTable(DISTANCE_DOMAIN)

DISTANCE_FUNCTIONS = _TABLE.entries

# PyTorch's threshold (rows on either side) above which p=2 uses matrix products
_MM_ROWS = 25


def _uses_matrix_product(x1, x2, p: float, compute_mode: Optional[int]) -> bool:
    mode = 0 if compute_mode is None else compute_mode
    if p != 2.0 or mode == 2:
        return False
    if mode == 1:
        return True
    rows1, rows2 = x1.shape[-2], x2.shape[-2]
    # a symbolic row count may exceed the threshold: the product form is then chosen
    return not isinstance(rows1, int) or not isinstance(rows2, int) or rows1 > _MM_ROWS or rows2 > _MM_ROWS


def _euclidean_by_products(x1, x2):
    last = op.Constant(value_ints=[-1])
    squares1 = op.ReduceSum(op.Mul(x1, x1), last, keepdims=1)  # (..., P, 1)
    squares2 = op.ReduceSum(op.Mul(x2, x2), last, keepdims=1)  # (..., R, 1)
    rank = len(x2.shape)
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    cross = op.MatMul(x1, op.Transpose(x2, perm=perm))
    squared = op.Add(op.Sub(squares1, op.Add(cross, cross)), op.Transpose(squares2, perm=perm))
    return op.Sqrt(op.Max(squared, scalar_like(0.0, squared)))


@_TABLE.op("aten::_cdist_forward")
def cdist_forward(x1: TFloat, x2: TFloat, p: float, compute_mode: Optional[int] = None) -> TFloat:
    if _uses_matrix_product(x1, x2, p, compute_mode):
        return _euclidean_by_products(x1, x2)
    last = op.Constant(value_ints=[-1])
    # (..., P, 1, M) - (..., 1, R, M): every pair's difference
    difference = op.Sub(op.Unsqueeze(x1, op.Constant(value_ints=[-2])), op.Unsqueeze(x2, op.Constant(value_ints=[-3])))
    magnitude = op.Abs(difference)
    if p == 0.0:
        nonzero = op.Cast(op.Not(op.Equal(magnitude, scalar_like(0.0, magnitude))), to=1)
        return op.CastLike(op.ReduceSum(nonzero, last, keepdims=0), x1)
    if math.isinf(p):
        return op.ReduceMax(magnitude, last, keepdims=0)
    if p == 1.0:
        return op.ReduceSum(magnitude, last, keepdims=0)
    if p == 2.0:
        return op.Sqrt(op.ReduceSumSquare(magnitude, last, keepdims=0))
    powered = op.ReduceSum(op.Pow(magnitude, scalar_like(p, magnitude)), last, keepdims=0)
    return op.Pow(powered, scalar_like(1.0 / p, powered))
