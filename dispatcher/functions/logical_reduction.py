"""``all`` and ``any`` along dims, for every rank PyTorch accepts.

PyTorch lets ``all``/``any`` reduce dim 0 (or -1) of a 0-d tensor, which ONNX reductions
refuse. Here a tensor is first read as truth values (``Cast`` to bool: nonzero and NaN
are true, as in PyTorch) and the truth values are counted: ``any`` is "at least one
true", ``all`` is "no false", so empty slices give PyTorch's False and True.
:data:`LOGICAL_REDUCTION_FUNCTIONS` lists (qualified ATen names, function).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import onnx_ir as ir
from onnxscript import opset18 as op

from dispatcher.function_table import FunctionTable

__all__ = ["LOGICAL_REDUCTION_FUNCTIONS", "LOGICAL_REDUCTION_DOMAIN"]

LOGICAL_REDUCTION_DOMAIN = "pkg.fx2onnx.logical_reduction"
_TABLE = FunctionTable(LOGICAL_REDUCTION_DOMAIN)

LOGICAL_REDUCTION_FUNCTIONS = _TABLE.entries

_BOOL, _INT64 = ir.DataType.BOOL.value, ir.DataType.INT64.value


def _count_true(truth, dims: Optional[Sequence[int]], keepdim: bool):
    counts = op.Cast(truth, to=_INT64)
    if dims is None or len(dims) == 0:
        return op.ReduceSum(counts, keepdims=keepdim)
    return op.ReduceSum(counts, op.Constant(value_ints=list(dims)), keepdims=keepdim)


def _any(x, dims: Optional[Sequence[int]], keepdim: bool):
    truth = op.Cast(x, to=_BOOL)
    if len(x.shape) == 0:
        return truth  # dim 0 or -1 of a 0-d tensor: the value itself
    return op.Greater(_count_true(truth, dims, keepdim), op.Constant(value_int=0))


def _all(x, dims: Optional[Sequence[int]], keepdim: bool):
    truth = op.Cast(x, to=_BOOL)
    if len(x.shape) == 0:
        return truth
    return op.Equal(_count_true(op.Not(truth), dims, keepdim), op.Constant(value_int=0))


@_TABLE.op("aten::any.dim")
def any_dim(self: Any, dim: int, keepdim: bool = False) -> Any:
    return _any(self, [dim], keepdim)


@_TABLE.op("aten::any.dims")
def any_dims(self: Any, dim: Optional[Sequence[int]] = None, keepdim: bool = False) -> Any:
    return _any(self, dim, keepdim)


@_TABLE.op("aten::all.dim")
def all_dim(self: Any, dim: int, keepdim: bool = False) -> Any:
    return _all(self, [dim], keepdim)


@_TABLE.op("aten::all.dims")
def all_dims(self: Any, dim: Optional[Sequence[int]] = None, keepdim: bool = False) -> Any:
    return _all(self, dim, keepdim)
