"""Arithmetic, reductions, norms, comparisons and searches on complex tensors."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional
import numpy as np
import onnx_ir as ir
from onnxscript import opset18 as op
from dispatcher.traced_values import scalar_like
from onnxscript.function_libs.torch_lib.tensor_typing import BOOL, INT64, TReal, TTensor
from dispatcher.functions.complex.movement import _abs, _atan2, _complex_op, _dim, _join_unsqueezed, _log, _matmul, _rank, _scale, _squeezed_parts, complex_sum_dim, component_dtype

# -- arithmetic ---------------------------------------------------------------------------


@_complex_op("aten::mul.Scalar", "aten::multiply.Scalar")
def complex_mul_scalar(self: TReal, other) -> TReal:
    return _scale(self, other)


@_complex_op("aten::div.Scalar", "aten::divide.Scalar", "aten::true_divide.Scalar")
def complex_div_scalar(self: TReal, other) -> TReal:
    # z / c = z * (1 / c); a real c divides both parts.
    number = complex(other)
    if number.imag == 0:
        return op.Div(self, scalar_like(number.real, self))
    return _scale(self, 1 / number)


@_complex_op("aten::cumsum")
def complex_cumsum(self: TReal, dim: int, dtype: int = -1) -> TReal:
    result = self
    if dtype is not None and dtype != -1:
        result = op.Cast(self, to=component_dtype(dtype))
    if _rank(self) == 0:
        return op.Identity(result)
    return op.CumSum(result, op.Constant(value_int=_dim(dim)))


@_complex_op("aten::mm", "aten::bmm", "aten::mv")
def complex_mm(self: TReal, mat2: TReal) -> TReal:
    if _rank(mat2) == 1:  # mv: matrix times vector
        column = op.Unsqueeze(mat2, op.Constant(value_ints=[-2]))
        return op.Squeeze(_matmul(self, column), op.Constant(value_ints=[-2]))
    return _matmul(self, mat2)


@_complex_op("aten::dot")
def complex_dot(self: TReal, tensor: TReal) -> TReal:
    row = op.Unsqueeze(self, op.Constant(value_ints=[0]))
    column = op.Unsqueeze(tensor, op.Constant(value_ints=[1]))
    return op.Reshape(_matmul(row, column), op.Constant(value_ints=[2]))


@_complex_op("aten::addmm")
def complex_addmm(self: TReal, mat1: TReal, mat2: TReal, beta=1.0, alpha=1.0) -> TReal:
    product = _scale(_matmul(mat1, mat2), alpha)
    if complex(beta) == 0:
        return product
    return op.Add(_scale(self, beta), product)


@_complex_op("aten::log")
def complex_log(self: TReal) -> TReal:
    return _log(self)


@_complex_op("aten::log10")
def complex_log10(self: TReal) -> TReal:
    return op.Div(_log(self), scalar_like(math.log(10.0), self))


@_complex_op("aten::log2")
def complex_log2(self: TReal) -> TReal:
    return op.Div(_log(self), scalar_like(math.log(2.0), self))


@_complex_op("aten::linalg_vector_norm")
def complex_linalg_vector_norm(self: TReal, ord=2.0, dim: Optional[Sequence[int]] = None, keepdim: bool = False, dtype: int = -1) -> TReal:
    magnitude = _abs(self)
    rank = _rank(self)
    if isinstance(dim, int):
        dim = [dim]
    axes = op.Constant(value_ints=list(range(rank)) if dim is None or len(dim) == 0 else [d % max(rank, 1) for d in dim])
    keep = 1 if keepdim else 0
    if rank == 0:
        result = op.Abs(magnitude) if ord != 0 else op.Cast(op.Not(op.Equal(magnitude, scalar_like(0.0, magnitude))), to=magnitude.dtype.value)
    elif ord == 2:
        result = op.Sqrt(op.ReduceSumSquare(magnitude, axes, keepdims=keep))
    elif ord == 1:
        result = op.ReduceSum(magnitude, axes, keepdims=keep)
    elif ord == math.inf:
        result = op.ReduceMax(magnitude, axes, keepdims=keep)
    elif ord == -math.inf:
        result = op.ReduceMin(magnitude, axes, keepdims=keep)
    elif ord == 0:
        nonzero = op.CastLike(op.Not(op.Equal(magnitude, scalar_like(0.0, magnitude))), magnitude)
        result = op.ReduceSum(nonzero, axes, keepdims=keep)
    else:
        power = scalar_like(float(ord), magnitude)
        summed = op.ReduceSum(op.Pow(magnitude, power), axes, keepdims=keep)
        result = op.Pow(summed, scalar_like(1.0 / float(ord), magnitude))
    if dtype is not None and dtype != -1:
        result = op.Cast(result, to=component_dtype(dtype))
    return result


@_complex_op("prims::var")
def complex_prims_var(inp: TReal, dims: Optional[Sequence[int]], correction: float, output_dtype: Optional[int] = None) -> TReal:
    # var(z) = var(real) + var(imag): the mean squared distance |z - mean|^2.
    rank = _rank(inp)
    axes_list = list(range(rank)) if not dims else [d % rank for d in dims]
    if rank == 0:
        axes_list = []
    axes = op.Constant(value_ints=axes_list)
    centered = op.Sub(inp, op.ReduceMean(inp, axes, keepdims=1)) if axes_list else op.Sub(inp, inp)
    squared = op.ReduceSumSquare(centered, op.Constant(value_ints=[-1]), keepdims=0)
    total = op.ReduceSum(squared, axes, keepdims=0) if axes_list else squared
    shape = op.Shape(inp)
    count = op.ReduceProd(op.Gather(shape, axes), keepdims=0) if axes_list else op.Constant(value_int=1)
    denominator = op.Max(op.Sub(op.CastLike(count, total), scalar_like(float(correction), total)), scalar_like(0.0, total))
    result = op.Div(total, denominator)
    if output_dtype is not None and output_dtype != -1:
        result = op.Cast(result, to=component_dtype(output_dtype))
    return result


@_complex_op("aten::gather")
def complex_gather(self: TTensor, dim: int, index: INT64, sparse_grad: bool = False) -> TTensor:
    # Each index picks a (real, imag) pair: the index gets the trailing axis too.
    pairs = op.Expand(
        op.Unsqueeze(index, op.Constant(value_ints=[-1])),
        op.Concat(op.Shape(index), op.Constant(value_ints=[2]), axis=0),
    )
    return op.GatherElements(self, pairs, axis=_dim(dim))


@_complex_op("aten::copy")
def complex_copy(self: TTensor, src: TTensor, non_blocking: bool = False) -> TTensor:
    return op.Expand(op.CastLike(src, self), op.Shape(self))


@_complex_op("aten::nonzero")
def complex_nonzero(self: TReal) -> INT64:
    real, imag = _squeezed_parts(self)
    zero = scalar_like(0.0, real)
    nonzero = op.Or(op.Not(op.Equal(real, zero)), op.Not(op.Equal(imag, zero)))
    if _rank(self) == 0:
        # (1, 0) when the number is not 0, else (0, 0)
        count = op.Reshape(op.Cast(nonzero, to=ir.DataType.INT64.value), op.Constant(value_ints=[1]))
        empty = op.Constant(value=ir.tensor(np.zeros((1, 0), dtype=np.int64)))
        return op.Expand(empty, op.Concat(count, op.Constant(value_ints=[0]), axis=0))
    return op.Transpose(op.NonZero(nonzero), perm=[1, 0])


def _equal(a, b):
    ar, ai = _squeezed_parts(a)
    br, bi = _squeezed_parts(b)
    return op.And(op.Equal(ar, br), op.Equal(ai, bi))


@_complex_op("prims::eq")
def complex_prims_eq(self: TReal, other: TReal) -> BOOL:
    return _equal(self, other)


@_complex_op("prims::ne")
def complex_prims_ne(self: TReal, other: TReal) -> BOOL:
    return op.Not(_equal(self, other))


@_complex_op("prims::neg")
def complex_prims_neg(self: TReal) -> TReal:
    return op.Neg(self)


@_complex_op("prims::exp")
def complex_prims_exp(self: TReal) -> TReal:
    # exp(a + bi) = e^a (cos b + i sin b)
    real, imag = _squeezed_parts(self)
    scale = op.Exp(real)
    return _join_unsqueezed(op.Mul(scale, op.Cos(imag)), op.Mul(scale, op.Sin(imag)))


@_complex_op("prims::sum")
def complex_prims_sum(inp: TReal, dims: Optional[Sequence[int]], output_dtype: Optional[int] = None) -> TReal:
    return complex_sum_dim(inp, dims, False, -1 if output_dtype is None else output_dtype)


@_complex_op("prims::div")
def complex_prims_div(self: TReal, other: TReal) -> TReal:
    # (a + bi) / (c + di) = ((ac + bd) + (bc - ad)i) / (c^2 + d^2)
    a, b = _squeezed_parts(self)
    c, d = _squeezed_parts(other)
    denominator = op.Add(op.Mul(c, c), op.Mul(d, d))
    real = op.Div(op.Add(op.Mul(a, c), op.Mul(b, d)), denominator)
    imag = op.Div(op.Sub(op.Mul(b, c), op.Mul(a, d)), denominator)
    return _join_unsqueezed(real, imag)



@_complex_op("prims::prod")
def complex_prims_prod(inp: TReal, dims: Optional[Sequence[int]], output_dtype: Optional[int] = None) -> TReal:
    # In polar form: magnitudes multiply, angles add.
    rank = _rank(inp)
    if rank == 0 or (dims is not None and len(dims) == 0):
        return op.Identity(inp)
    axes = op.Constant(value_ints=list(range(rank)) if dims is None else sorted({d % rank for d in dims}))
    real, imag = _squeezed_parts(inp)
    magnitude = op.ReduceProd(op.Sqrt(op.Add(op.Mul(real, real), op.Mul(imag, imag))), axes, keepdims=0)
    angle = op.ReduceSum(_atan2(imag, real), axes, keepdims=0)
    result = _join_unsqueezed(op.Mul(magnitude, op.Cos(angle)), op.Mul(magnitude, op.Sin(angle)))
    if output_dtype is not None and output_dtype != -1:
        result = op.Cast(result, to=component_dtype(output_dtype))
    return result


@_complex_op("aten::masked_select")
def complex_masked_select(self: TReal, mask: BOOL) -> TReal:
    # (real, imag) pairs stay together: the mask gets the trailing axis too
    values = op.Expand(self, op.Concat(op.Shape(mask), op.Constant(value_ints=[1]), axis=0))
    pairs = op.Expand(op.Unsqueeze(mask, op.Constant(value_ints=[-1])), op.Shape(values))
    flat = op.Constant(value_ints=[-1])
    selected = op.Compress(op.Reshape(values, flat), op.Reshape(pairs, flat), axis=0)
    return op.Reshape(selected, op.Constant(value_ints=[-1, 2]))


@_complex_op("aten::sym_size.int")
def complex_sym_size(self: TTensor, dim: int) -> INT64:
    # the size of a complex dim: the trailing (real, imag) axis is not one of them
    return op.Gather(op.Shape(self), op.Constant(value_int=_dim(dim)), axis=0)
