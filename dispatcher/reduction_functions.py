"""Reductions torchlib has no function for: ``prims::prod``, ``nanmedian``, ``segment_reduce``.

``prims::prod`` appears when PyTorch's decomposition of ``cumprod`` (which torchlib does
not implement) multiplies a masked copy of its input along a new axis; ``linalg.vander``
and the masked cumulative product reach it the same way. ``nanmedian`` sorts each slice
with NaN last and takes the lower median of its numbers (``masked.median`` reaches it).

:data:`REDUCTION_FUNCTIONS` lists (qualified ATen names, function); the registry adds
them after torchlib's functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from onnxscript import opset18 as op

from dispatcher.function_table import FunctionTable
from onnxscript.function_libs.torch_lib.tensor_typing import TTensor

__all__ = ["REDUCTION_FUNCTIONS", "REDUCTION_DOMAIN"]

REDUCTION_DOMAIN = "pkg.fx2onnx.reduction"
_TABLE = FunctionTable(REDUCTION_DOMAIN)

REDUCTION_FUNCTIONS = _TABLE.entries

_reduction_op = _TABLE.op

_INT64 = 7  # onnx.TensorProto.INT64
_BOOL = 9  # onnx.TensorProto.BOOL


@_reduction_op("prims::prod")
def prims_prod(inp: TTensor, dims: Optional[Sequence[int]], output_dtype: Optional[int] = None) -> TTensor:
    # ReduceProd has no bool kernel: PyTorch multiplies bools as integers.
    values = op.Cast(inp, to=_INT64) if inp.dtype == _BOOL else inp
    if dims is None:
        result = op.ReduceProd(values, keepdims=0)
    elif len(dims) == 0:  # no dim: the product of each element alone
        result = op.Identity(values)
    else:
        result = op.ReduceProd(values, op.Constant(value_ints=list(dims)), keepdims=0)
    if output_dtype is not None and output_dtype != -1:
        result = op.Cast(result, to=output_dtype)
    return result


# -- nanmedian ---------------------------------------------------------------------------

_FLOATING = (1, 10, 11, 16)  # FLOAT, FLOAT16, DOUBLE, BFLOAT16


def _nanmedian_along(x, dim: int, keepdim: bool):
    """The lower median of the numbers of each slice along ``dim`` and its index. A
    slice of NaN only gives NaN and the index of its first NaN (PyTorch's index there
    depends on its selection algorithm)."""
    axis = op.Constant(value_ints=[dim])
    size = op.Gather(op.Shape(x), axis)
    if x.dtype in _FLOATING:
        nan = op.IsNaN(x)
        # NaN sorts last; TopK keeps equal keys in index order
        key = op.Where(nan, op.CastLike(op.Constant(value_float=float("inf")), x), x)
        numbers = op.ReduceSum(op.Cast(op.Not(nan), to=_INT64), axis, keepdims=1)
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
