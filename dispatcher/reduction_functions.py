"""Reductions torchlib has no function for: ``prims::prod``, ``nanmedian``, ``segment_reduce``.

``prims::prod`` appears when PyTorch's decomposition of ``cumprod`` (which torchlib does
not implement) multiplies a masked copy of its input along a new axis; ``linalg.vander``
and the masked cumulative product reach it the same way.

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
