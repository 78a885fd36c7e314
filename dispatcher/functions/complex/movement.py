"""fx2onnx's own complex implementations of ATen operators that torchlib has none for.

A complex tensor travels as a real tensor with a trailing dimension of 2 (real, imag);
every function here takes and returns that real form. Most of them only move data, so
they call the real ONNX operator with the dims adjusted for the extra trailing axis: a
negative dim ``d`` becomes ``d - 1``, a size list gets ``2`` appended, pads leave the
trailing axis alone. Arithmetic ones (matrix products, logarithms, norms, variance)
combine the real and imaginary parts.

Dtype arguments reach these functions as ONNX ``COMPLEX64``/``COMPLEX128`` when PyTorch
asks for a complex dtype (the interpreter passes them so), so that ``_to_copy`` can tell
a complex target from a real one; :func:`component_dtype` maps them to FLOAT/DOUBLE.

:data:`COMPLEX_FUNCTIONS` lists (qualified ATen names, function); the registry adds them
after torchlib's functions as non-custom complex defaults.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Optional

import onnx_ir as ir
from onnxscript import opset18 as op

from dispatcher.function_table import FunctionTable
from dispatcher.traced_values import int64_vector, scalar_like
from onnxscript.function_libs.torch_lib.tensor_typing import BOOL, INT64, TReal, TTensor

__all__ = ["COMPLEX_FUNCTIONS", "COMPLEX_DOMAIN", "component_dtype"]

# The domain of these functions' opset: they are traced into standard ONNX operators,
# so the domain only tells the interpreter that a function is one of these.
COMPLEX_DOMAIN = "pkg.fx2onnx.complex"
_TABLE = FunctionTable(COMPLEX_DOMAIN)

_COMPLEX_TO_COMPONENT = {
    ir.DataType.COMPLEX64.value: ir.DataType.FLOAT.value,
    ir.DataType.COMPLEX128.value: ir.DataType.DOUBLE.value,
}

# Only overloads that torchlib has a real function for are registered: a complex-only
# entry would hide the real fallback (default overload, decomposition) of real calls.
COMPLEX_FUNCTIONS = _TABLE.entries

_complex_op = _TABLE.op


# -- helpers ------------------------------------------------------------------------------


def component_dtype(dtype: int) -> int:
    """The ONNX dtype of the real form of a tensor of ONNX dtype ``dtype``."""
    return _COMPLEX_TO_COMPONENT.get(dtype, dtype)


def _is_complex_dtype(dtype: Any) -> bool:
    return dtype in _COMPLEX_TO_COMPONENT


def _rank(value) -> int:
    """The rank of the complex tensor that ``value`` (real form) represents."""
    return len(value.shape) - 1


def _dim(dim: int) -> int:
    """A complex tensor's dim as a dim of its real form."""
    return dim - 1 if dim < 0 else dim


def _with_pair(size: Any) -> Any:
    """``size`` with the trailing 2 of the real form appended."""
    if isinstance(size, ir.Value):
        return op.Concat(op.Cast(size, to=ir.DataType.INT64.value), op.Constant(value_ints=[2]), axis=0)
    return int64_vector([*size, 2])


def _parts(z):
    """(real, imag) of the real form, each keeping a trailing axis of size 1."""
    real, imag = op.Split(z, axis=-1, num_outputs=2)
    return real, imag


def _squeezed_parts(z):
    real, imag = _parts(z)
    axis = op.Constant(value_ints=[-1])
    return op.Squeeze(real, axis), op.Squeeze(imag, axis)


def _join(real, imag):
    """The real form from parts that keep a trailing axis of size 1."""
    return op.Concat(real, imag, axis=-1)


def _join_unsqueezed(real, imag):
    axis = op.Constant(value_ints=[-1])
    return op.Concat(op.Unsqueeze(real, axis), op.Unsqueeze(imag, axis), axis=-1)


def _complex_pair_like(value: Any, like):
    """A Python number as a real-form [real, imag] constant of ``like``'s dtype."""
    number = complex(value)
    return op.CastLike(op.Constant(value_floats=[number.real, number.imag]), like)


def _scale(z, factor: Any):
    """``z * factor`` for a Python number ``factor`` (real or complex)."""
    number = complex(factor)
    if number.imag == 0:
        return op.Mul(z, scalar_like(number.real, z))
    real, imag = _parts(z)
    c = scalar_like(number.real, z)
    d = scalar_like(number.imag, z)
    return _join(op.Sub(op.Mul(real, c), op.Mul(imag, d)), op.Add(op.Mul(real, d), op.Mul(imag, c)))


def _matmul(a, b):
    """Complex matrix product of two real forms (MatMul broadcasting rules)."""
    ar, ai = _squeezed_parts(a)
    br, bi = _squeezed_parts(b)
    real = op.Sub(op.MatMul(ar, br), op.MatMul(ai, bi))
    imag = op.Add(op.MatMul(ar, bi), op.MatMul(ai, br))
    return _join_unsqueezed(real, imag)


def _atan2(y, x):
    """atan2(y, x) elementwise, atan2(0, 0) = 0 as in PyTorch."""
    zero = op.CastLike(op.Constant(value_float=0.0), x)
    pi = op.CastLike(op.Constant(value_float=math.pi), x)
    half_pi = op.CastLike(op.Constant(value_float=math.pi / 2), x)
    x_is_zero = op.Equal(x, zero)
    safe_x = op.Where(x_is_zero, op.CastLike(op.Constant(value_float=1.0), x), x)
    base = op.Atan(op.Div(y, safe_x))
    y_negative = op.Less(y, zero)
    shift = op.Where(y_negative, op.Neg(pi), pi)
    angle = op.Where(op.Less(x, zero), op.Add(base, shift), base)
    on_axis = op.Where(op.Equal(y, zero), zero, op.Where(y_negative, op.Neg(half_pi), half_pi))
    return op.Where(x_is_zero, on_axis, angle)


def _abs(z):
    """|z| as a real tensor of the complex shape."""
    return op.Sqrt(op.ReduceSumSquare(z, op.Constant(value_ints=[-1]), keepdims=0))


def _log(z):
    real, imag = _squeezed_parts(z)
    magnitude = op.Sqrt(op.Add(op.Mul(real, real), op.Mul(imag, imag)))
    return _join_unsqueezed(op.Log(magnitude), _atan2(imag, real))


def _like_filled(shape, fill_value: Any, like, dtype: int):
    """A tensor of ``shape`` (real form when ``dtype`` is complex) filled with a number."""
    if _is_complex_dtype(dtype) or dtype == -1:
        pair = _complex_pair_like(fill_value, like)
        if dtype != -1:
            pair = op.Cast(pair, to=component_dtype(dtype))
        return op.Expand(pair, shape)
    number = complex(fill_value)
    return op.Expand(op.Cast(op.Constant(value_float=number.real), to=dtype), shape)


def _complex_shape(z):
    """The complex shape of a real form, as a 1-D INT64 tensor."""
    return op.Shape(z, end=-1)


# -- shape and data movement --------------------------------------------------------------


@_complex_op("aten::unsqueeze")
def complex_unsqueeze(self: TTensor, dim: int) -> TTensor:
    return op.Unsqueeze(self, op.Constant(value_ints=[_dim(dim)]))


@_complex_op("aten::squeeze")
def complex_squeeze(self: TTensor) -> TTensor:
    axes = [i for i, size in enumerate(list(self.shape)[:-1]) if size == 1]
    if not axes:
        return op.Identity(self)
    return op.Squeeze(self, op.Constant(value_ints=axes))


@_complex_op("prims::squeeze")
def complex_prims_squeeze(a: TTensor, dimensions: Sequence[int]) -> TTensor:
    rank = _rank(a)
    axes = sorted({d % rank for d in dimensions}) if rank else []
    if not axes:
        return op.Identity(a)
    return op.Squeeze(a, op.Constant(value_ints=axes))


@_complex_op("aten::expand")
def complex_expand(self: TTensor, size: Sequence[INT64], implicit: bool = False) -> TTensor:
    # -1 keeps a dim in PyTorch; ONNX broadcasting keeps it for 1, hence Abs.
    return op.Expand(self, op.Abs(_with_pair(size)))


@_complex_op("aten::where.self", "aten::where.ScalarOther", "aten::where.ScalarSelf")
def complex_where(condition: BOOL, self: TTensor, other: TTensor) -> TTensor:
    return op.Where(op.Unsqueeze(condition, op.Constant(value_ints=[-1])), self, other)


def _slice(x, start: int, end: int, axis: int):
    return op.Slice(x, op.Constant(value_ints=[start]), op.Constant(value_ints=[end]), op.Constant(value_ints=[axis]))


def _pad_circular(self, begins: list[int], ends: list[int], axes: list[int]):
    # Wrap around: the last `begin` entries go before, the first `end` ones after.
    result = self
    for begin, end, axis in zip(begins, ends, axes):
        pieces = []
        if begin:
            pieces.append(_slice(result, -begin, 2**62, axis))
        pieces.append(result)
        if end:
            pieces.append(_slice(result, 0, end, axis))
        result = op.Concat(*pieces, axis=axis) if len(pieces) > 1 else result
    return result


def _pad(self, pad: Sequence[Any], mode: str, value: Any):
    pairs = len(pad) // 2
    # pad = [begin, end] for the last dim, then the one before...; ONNX wants
    # every begin then every end, for the axes listed.
    axes = [-(i + 2) for i in range(pairs)]
    begins = [pad[2 * i] for i in range(pairs)]
    ends = [pad[2 * i + 1] for i in range(pairs)]
    pads = int64_vector([*begins, *ends])
    axes_value = op.Constant(value_ints=axes)
    if mode == "circular" and all(isinstance(p, int) and p >= 0 for p in pad):
        return _pad_circular(self, begins, ends, axes)
    if mode == "replicate" and any(isinstance(p, int) and p < 0 for p in pad):
        # A negative pad crops, yet PyTorch still repeats the edge of the whole input
        # (output i reads input clamp(i - begin)); onnxruntime's edge mode cannot.
        shape = list(self.shape)
        for begin, end, axis in zip(begins, ends, axes):
            size = shape[axis]
            if not (isinstance(size, int) and size > 0 and isinstance(begin, int) and isinstance(end, int)):
                raise NotImplementedError("complex replicate padding with negative pads needs static sizes")
            positions = [min(max(i - begin, 0), size - 1) for i in range(size + begin + end)]
            self = op.Gather(self, op.Constant(value_ints=positions), axis=axis)
        return self
    if mode != "constant":
        onnx_mode = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
        return op.Pad(self, pads, None, axes_value, mode=onnx_mode)
    number = complex(value or 0.0)
    if number.real == number.imag:
        return op.Pad(self, pads, scalar_like(number.real, self), axes_value)
    real, imag = _parts(self)
    return _join(
        op.Pad(real, pads, scalar_like(number.real, self), axes_value),
        op.Pad(imag, pads, scalar_like(number.imag, self), axes_value),
    )


@_complex_op("aten::constant_pad_nd")
def complex_constant_pad_nd(self: TTensor, pad: Sequence[INT64], value=0.0) -> TTensor:
    return _pad(self, pad, "constant", value)


@_complex_op("aten::pad")
def complex_pad(self: TTensor, pad: Sequence[INT64], mode: str = "constant", value=None) -> TTensor:
    return _pad(self, pad, mode, value)


@_complex_op("aten::split_with_sizes")
def complex_split_with_sizes(self: TTensor, split_sizes: Sequence[INT64], dim: int = 0) -> TTensor:
    pieces = op.SplitToSequence(self, int64_vector(split_sizes), axis=_dim(dim))
    return tuple(op.SequenceAt(pieces, op.Constant(value_int=i)) for i in range(len(split_sizes)))


@_complex_op("aten::split.Tensor", "aten::unsafe_split.Tensor")
def complex_split(self: TTensor, split_size: int, dim: int = 0) -> TTensor:
    length = self.shape[_dim(dim)]
    if not isinstance(length, int):
        raise NotImplementedError("complex split needs a static size along the split dim")
    sizes = [split_size] * (length // split_size)
    if length % split_size or not sizes:
        sizes.append(length % split_size)
    return complex_split_with_sizes(self, sizes, dim)


@_complex_op("aten::diagonal", "aten::diagonal_copy")
def complex_diagonal(self: TTensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> TTensor:
    shape = list(self.shape)
    rank = len(shape) - 1
    dim1, dim2 = dim1 % rank, dim2 % rank
    n1, n2 = shape[dim1], shape[dim2]
    if not (isinstance(n1, int) and isinstance(n2, int)):
        raise NotImplementedError("complex diagonal needs static sizes of the two dims")
    others = [d for d in range(rank) if d not in (dim1, dim2)]
    moved = op.Transpose(self, perm=[*others, dim1, dim2, rank])
    flat = op.Reshape(moved, int64_vector([*[0] * len(others), n1 * n2, 2]))
    if offset >= 0:
        length = max(0, min(n1, n2 - offset))
        positions = [i * n2 + i + offset for i in range(length)]
    else:
        length = max(0, min(n1 + offset, n2))
        positions = [(i - offset) * n2 + i for i in range(length)]
    if not positions:
        return op.Slice(flat, op.Constant(value_ints=[0]), op.Constant(value_ints=[0]), op.Constant(value_ints=[-2]))
    return op.Gather(flat, op.Constant(value_ints=positions), axis=-2)


@_complex_op("aten::as_strided")
def complex_as_strided(
    self: TTensor, size: Sequence[INT64], stride: Sequence[INT64], storage_offset: Optional[INT64] = None
) -> TTensor:
    # Element (i_0, ..., i_k) reads complex storage position offset + sum(i_j * stride_j).
    pairs = op.Reshape(self, op.Constant(value_ints=[-1, 2]))
    size, stride = list(size), list(stride)
    positions = op.Constant(value_int=int(storage_offset) if isinstance(storage_offset, int) else 0)
    if isinstance(storage_offset, ir.Value):
        positions = op.Cast(storage_offset, to=ir.DataType.INT64.value)
    rank = len(size)
    for axis, (length, step) in enumerate(zip(size, stride)):
        index = op.Range(
            op.Constant(value_int=0),
            int64_vector([length]) if not isinstance(length, int) else op.Constant(value_int=length),
            op.Constant(value_int=1),
        )
        index = op.Mul(index, int64_vector([step]))
        shape = [1] * rank
        shape[axis] = -1
        positions = op.Add(positions, op.Reshape(index, op.Constant(value_ints=shape)))
    return op.Gather(pairs, positions, axis=0)


@_complex_op("aten::select.int")
def complex_select(self: TTensor, dim: int, index: int) -> TTensor:
    return op.Gather(self, op.Constant(value_int=index), axis=_dim(dim))


@_complex_op("aten::sum")
def complex_sum(self: TReal, dtype: int = -1) -> TReal:
    # A 0-d complex tensor is [2] in its real form: nothing to add up.
    result = self
    if _rank(self) > 0:
        result = op.ReduceSum(self, op.Constant(value_ints=list(range(_rank(self)))), keepdims=0)
    if dtype is not None and dtype != -1:
        result = op.Cast(result, to=component_dtype(dtype))
    return op.Identity(result)


def _torchlib(name: str):
    from onnxscript.function_libs.torch_lib.ops import core

    return getattr(core, name)


@_complex_op("aten::index_put", "aten::_unsafe_index_put")
def complex_index_put(self: TReal, indices: Sequence[Optional[INT64]], values: TReal, accumulate: bool = False) -> TReal:
    # The indices never reach the trailing axis, so real index_put on the real form
    # writes (real, imag) pairs: torchlib's real function does it.
    return _torchlib("aten_index_put")(self, list(indices), values, accumulate)


@_complex_op("aten::index.Tensor", "aten::_unsafe_index.Tensor")
def complex_index(self: TTensor, indices: Sequence[Optional[INT64]]) -> TTensor:
    return _torchlib("aten_index")(self, list(indices))


@_complex_op("aten::sum.dim_IntList")
def complex_sum_dim(self: TReal, dim: Optional[Sequence[int]] = None, keepdim: bool = False, dtype: int = -1) -> TReal:
    rank = _rank(self)
    if isinstance(dim, int):
        dim = [dim]
    result = self
    if rank > 0:
        axes = list(range(rank)) if not dim else sorted({d % rank for d in dim})
        result = op.ReduceSum(self, op.Constant(value_ints=axes), keepdims=1 if keepdim else 0)
    if dtype is not None and dtype != -1:
        result = op.Cast(result, to=component_dtype(dtype))
    return op.Identity(result)


@_complex_op("aten::mean")
def complex_mean(self: TReal, dtype: int = -1) -> TReal:
    # A 0-d complex tensor is [2] in its real form: it is its own mean.
    result = self
    if _rank(self) > 0:
        result = op.ReduceMean(self, op.Constant(value_ints=list(range(_rank(self)))), keepdims=0)
    if dtype is not None and dtype != -1:
        result = op.Cast(result, to=component_dtype(dtype))
    return op.Identity(result)


@_complex_op("aten::resolve_conj", "aten::resolve_neg", "aten::lift_fresh_copy", "aten::alias", "aten::detach")
def complex_identity(self: TTensor) -> TTensor:
    # Exported graphs hold materialized tensors: the conj/neg bits are already applied.
    return op.Identity(self)


@_complex_op("aten::_conj_physical")
def complex_conj_physical(self: TReal) -> TReal:
    # the conjugate of the real form: the imaginary parts negated
    return op.Mul(self, op.CastLike(op.Constant(value_floats=[1.0, -1.0]), self))


@_complex_op("aten::_to_copy")
def complex_to_copy(
    self: TTensor,
    dtype: int = -1,
    layout: str = "",
    device: str = "",
    pin_memory: bool = False,
    non_blocking: bool = False,
    memory_format: str = "",
) -> TTensor:
    if dtype is None or dtype == -1:
        return op.Identity(self)
    if _is_complex_dtype(dtype):
        return op.Cast(self, to=component_dtype(dtype))
    real, imag = _squeezed_parts(self)
    if dtype == ir.DataType.BOOL.value:
        zero = scalar_like(0.0, real)
        return op.Or(op.Not(op.Equal(real, zero)), op.Not(op.Equal(imag, zero)))
    # complex -> real keeps the real part (PyTorch warns that it discards the imaginary).
    return op.Cast(real, to=dtype)
