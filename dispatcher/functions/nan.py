"""Reductions that propagate NaN as PyTorch does, where ONNX's ops skip it.

PyTorch's ``max``/``min`` (whole tensor or along a dim), ``amax``/``amin`` and
``argmax``/``argmin`` return NaN (or the index of the first NaN) for a slice that holds
one; ONNX's ReduceMax/ReduceMin/ArgMax/ArgMin ignore NaN in ONNX Runtime. ``topk``
with ``largest=False`` may pick a NaN before numbers. ``maximum``, ``minimum``,
``clamp`` and ``sort`` already agree (ONNX ``Max``/``Min`` propagate NaN; a full ``TopK``
puts NaN where PyTorch's sort does), so they are not redefined (tests check them).

Each function computes the ONNX reduction and, from ``IsNaN``, whether the slice holds
a NaN and where the first one is, and selects with ``Where``. The functions take
floating inputs only: integer inputs keep torchlib's functions. :data:`NAN_FUNCTIONS`
lists (qualified ATen names, function); the registry adds them after torchlib's, so
they are preferred for floating inputs and user registrations still win.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import onnx_ir as ir
from onnxscript import opset18 as op

from dispatcher.function_table import FunctionTable
from dispatcher.traced_values import keep_rank_of, scalar_like
from onnxscript.function_libs.torch_lib.tensor_typing import INT64, TFloat

__all__ = ["NAN_FUNCTIONS", "NAN_DOMAIN"]

NAN_DOMAIN = "pkg.fx2onnx.nan"
_TABLE = FunctionTable(NAN_DOMAIN)

NAN_FUNCTIONS = _TABLE.entries

_FLOAT = ir.DataType.FLOAT.value  # the mask is reduced as float, which every runtime has

_nan_op = _TABLE.op


# -- helpers ------------------------------------------------------------------------------


def _nan_mask(x):
    """1.0 where x is NaN, 0.0 elsewhere (float)."""
    return op.Cast(op.IsNaN(x), to=_FLOAT)


def _axes(dims: Sequence[int]):
    return op.Constant(value_ints=list(dims))


def _reduce(reduce_op, x, dims: Optional[Sequence[int]], keepdim: bool):
    """``reduce_op`` over ``dims`` (every axis when None or empty) with NaN propagated."""
    if x.shape is not None and len(x.shape) == 0:
        return op.Identity(x)  # PyTorch accepts dim 0 or -1 on a 0-d tensor: the value itself
    if dims is None or len(dims) == 0:
        result = reduce_op(x, keepdims=keepdim)
        has_nan = op.ReduceMax(_nan_mask(x), keepdims=keepdim)
    else:
        axes = _axes(dims)
        result = reduce_op(x, axes, keepdims=keepdim)
        has_nan = op.ReduceMax(_nan_mask(x), axes, keepdims=keepdim)
    return op.Where(op.Greater(has_nan, op.Constant(value_float=0.0)), scalar_like(float("nan"), x), result)


def _arg(arg_op, x, dim: int, keepdim: bool):
    """``arg_op`` along ``dim``; a slice holding a NaN gives the index of its first NaN."""
    mask = _nan_mask(x)
    index = arg_op(x, axis=dim, keepdims=keepdim)
    first_nan = op.ArgMax(mask, axis=dim, keepdims=keepdim)
    has_nan = op.ReduceMax(mask, op.Constant(value_ints=[dim]), keepdims=keepdim)
    return op.Where(op.Greater(has_nan, op.Constant(value_float=0.0)), first_nan, index)


def _arg_flat_or_dim(arg_op, x, dim: Optional[int], keepdim: bool):
    if len(x.shape) == 0:
        return op.Constant(value_int=0)
    if dim is None:
        flat = op.Reshape(x, op.Constant(value_ints=[-1]))
        return keep_rank_of(x, _arg(arg_op, flat, 0, False), keepdim)
    return _arg(arg_op, x, dim, keepdim)


# -- functions ----------------------------------------------------------------------------


@_nan_op("aten::max")
def nan_max(self: TFloat) -> TFloat:
    return _reduce(op.ReduceMax, self, None, False)


@_nan_op("aten::min")
def nan_min(self: TFloat) -> TFloat:
    return _reduce(op.ReduceMin, self, None, False)


@_nan_op("aten::amax")
def nan_amax(self: TFloat, dim: Sequence[int] = (), keepdim: bool = False) -> TFloat:
    return _reduce(op.ReduceMax, self, dim, keepdim)


@_nan_op("aten::amin")
def nan_amin(self: TFloat, dim: Sequence[int] = (), keepdim: bool = False) -> TFloat:
    return _reduce(op.ReduceMin, self, dim, keepdim)


@_nan_op("aten::max.dim")
def nan_max_dim(self: TFloat, dim: int, keepdim: bool = False) -> tuple[TFloat, INT64]:
    if len(self.shape) == 0:
        return op.Identity(self), op.Constant(value_int=0)
    return _reduce(op.ReduceMax, self, [dim], keepdim), _arg(op.ArgMax, self, dim, keepdim)


@_nan_op("aten::min.dim")
def nan_min_dim(self: TFloat, dim: int, keepdim: bool = False) -> tuple[TFloat, INT64]:
    if len(self.shape) == 0:
        return op.Identity(self), op.Constant(value_int=0)
    return _reduce(op.ReduceMin, self, [dim], keepdim), _arg(op.ArgMin, self, dim, keepdim)


@_nan_op("aten::argmax")
def nan_argmax(self: TFloat, dim: Optional[int] = None, keepdim: bool = False) -> INT64:
    return _arg_flat_or_dim(op.ArgMax, self, dim, keepdim)


@_nan_op("aten::argmin")
def nan_argmin(self: TFloat, dim: Optional[int] = None, keepdim: bool = False) -> INT64:
    return _arg_flat_or_dim(op.ArgMin, self, dim, keepdim)


@_nan_op("aten::topk")
def nan_topk(
    self: TFloat, k: int, dim: int = -1, largest: bool = True, sorted: bool = True
) -> tuple[TFloat, INT64]:
    # PyTorch orders NaN above every number; TopK(largest=0) may pick a NaN before
    # numbers, so the smallest are chosen on a key where NaN is +inf.
    k_tensor = op.Constant(value_ints=[k])
    if largest:
        return op.TopK(self, k_tensor, axis=dim, largest=True, sorted=sorted)
    key = op.Where(op.IsNaN(self), scalar_like(float("inf"), self), self)
    _, indices = op.TopK(key, k_tensor, axis=dim, largest=False, sorted=sorted)
    return op.GatherElements(self, indices, axis=dim), indices
