"""Elementwise primitives (``prims::``) that PyTorch's decompositions leave in the graph.

``fmax``/``fmin`` ignore a NaN operand (ONNX ``Max``/``Min`` propagate it), ``hypot``
scales by the larger magnitude so that squares cannot overflow, and ``nextafter`` and
``frexp`` read a float's binary exponent from ``Log`` with exact corrections by powers of
two (ONNX has no bit cast in opset 18). The inputs of a ``prims::`` op already share one
dtype (PyTorch's decomposition promoted them).
"""

from __future__ import annotations

import math

import onnx_ir as ir
from onnxscript import opset18 as op

from dispatcher._types import is_float_value
from dispatcher.function_table import FunctionTable
from onnxscript.function_libs.torch_lib.tensor_typing import INT32, TFloat, TReal

__all__ = ["ELEMENTWISE_FUNCTIONS", "ELEMENTWISE_DOMAIN"]

ELEMENTWISE_DOMAIN = "pkg.fx2onnx.elementwise"
_TABLE = FunctionTable(ELEMENTWISE_DOMAIN)

ELEMENTWISE_FUNCTIONS = _TABLE.entries

_elementwise_op = _TABLE.op

_INT32 = ir.DataType.INT32.value

# (mantissa bits, smallest normal exponent, largest finite value) of each float type.
_FLOAT_FORMATS = {
    ir.DataType.FLOAT: (23, -126, 3.4028234663852886e38),
    ir.DataType.DOUBLE: (52, -1022, 1.7976931348623157e308),
    ir.DataType.FLOAT16: (10, -14, 65504.0),
    ir.DataType.BFLOAT16: (7, -126, 3.3895313892515355e38),
}


def _c(value: float, like):
    """A constant of like's type; float64 ones are made in float64 (2**-1074 and the
    largest double do not survive float32)."""
    if getattr(like, "dtype", None) == ir.DataType.DOUBLE:
        return op.Constant(value=ir.tensor(value, dtype=ir.DataType.DOUBLE))
    return op.CastLike(op.Constant(value_float=value), like)


def _ignoring_nan(binary, self, other):
    if not is_float_value(self):
        return binary(self, other)
    chosen = binary(self, other)
    chosen = op.Where(op.IsNaN(self), other, chosen)
    return op.Where(op.IsNaN(other), self, chosen)


@_elementwise_op("prims::fmax")
def prims_fmax(self: TReal, other: TReal) -> TReal:
    return _ignoring_nan(op.Max, self, other)


@_elementwise_op("prims::fmin")
def prims_fmin(self: TReal, other: TReal) -> TReal:
    return _ignoring_nan(op.Min, self, other)


@_elementwise_op("prims::hypot")
def prims_hypot(self: TFloat, other: TFloat) -> TFloat:
    a, b = op.Abs(self), op.Abs(other)
    larger, smaller = op.Max(a, b), op.Min(a, b)
    zero = _c(0.0, self)
    ratio = op.Where(op.Equal(larger, zero), zero, op.Div(smaller, larger))
    result = op.Mul(larger, op.Sqrt(op.Add(_c(1.0, self), op.Mul(ratio, ratio))))
    # An infinite operand gives +inf even when the other is NaN (C's hypot).
    infinite = op.Or(op.IsInf(self), op.IsInf(other))
    return op.Where(infinite, _c(float("inf"), self), result)


def _binary_exponent(magnitude):
    """floor(log2(m)) for finite m > 0, exact: Log's estimate corrected by powers of two."""
    two = _c(2.0, magnitude)
    one = _c(1.0, magnitude)
    e = op.Floor(op.Div(op.Log(magnitude), _c(math.log(2.0), magnitude)))
    e = op.Where(op.Greater(op.Pow(two, e), magnitude), op.Sub(e, one), e)
    return op.Where(op.LessOrEqual(op.Pow(two, op.Add(e, one)), magnitude), op.Add(e, one), e)


@_elementwise_op("prims::nextafter")
def prims_nextafter(self: TFloat, other: TFloat) -> TFloat:
    mantissa_bits, min_exponent, largest = _FLOAT_FORMATS[self.dtype]
    two = _c(2.0, self)
    zero = _c(0.0, self)
    magnitude = op.Abs(self)
    finite_positive = op.Where(op.Or(op.Equal(magnitude, zero), op.IsInf(magnitude)), _c(1.0, self), magnitude)
    exponent = op.Max(_binary_exponent(finite_positive), _c(float(min_exponent), self))
    ulp = op.Pow(two, op.Sub(exponent, _c(float(mantissa_bits), self)))
    # Zero's neighbours are the smallest subnormals.
    ulp = op.Where(op.Equal(magnitude, zero), _c(2.0 ** (min_exponent - mantissa_bits), self), ulp)
    upward = op.Greater(other, self)
    toward_zero = op.Xor(upward, op.Greater(self, zero))
    # Below a power of two (toward zero), the spacing is half.
    at_power = op.And(op.Equal(op.Pow(two, exponent), magnitude), op.Greater(exponent, _c(float(min_exponent), self)))
    ulp = op.Where(op.And(op.And(toward_zero, at_power), op.Not(op.Equal(magnitude, zero))), op.Div(ulp, two), ulp)
    step = op.Where(upward, ulp, op.Neg(ulp))
    result = op.Add(self, step)
    # Infinity steps to the largest finite value of its sign.
    result = op.Where(op.IsInf(self), op.Mul(op.Sign(self), _c(largest, self)), result)
    result = op.Where(op.Equal(self, other), other, result)
    nan = op.Or(op.IsNaN(self), op.IsNaN(other))
    return op.Where(nan, _c(float("nan"), self), result)


@_elementwise_op("prims::frexp")
def prims_frexp(self: TFloat) -> tuple[TFloat, INT32]:
    # mantissa in [0.5, 1) with self = mantissa * 2**exponent; 0, inf and NaN keep
    # themselves as mantissa with exponent 0 (divided by 2**0, which keeps -0.0: a Where
    # would lose its sign in ONNX Runtime).
    zero = _c(0.0, self)
    two = _c(2.0, self)
    magnitude = op.Abs(self)
    special = op.Or(op.Or(op.Equal(magnitude, zero), op.IsInf(self)), op.IsNaN(self))
    finite_positive = op.Where(special, _c(1.0, self), magnitude)
    exponent = op.Where(special, zero, op.Add(_binary_exponent(finite_positive), _c(1.0, self)))
    # Divided by 2**exponent in two halves: 2**128 overflows float32 where 2**64 does not.
    half = op.Floor(op.Div(exponent, two))
    mantissa = op.Div(op.Div(self, op.Pow(two, half)), op.Pow(two, op.Sub(exponent, half)))
    return mantissa, op.Cast(exponent, to=_INT32)
