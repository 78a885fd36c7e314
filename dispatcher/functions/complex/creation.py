"""Tensors created from a complex tensor: the *_like and new_* families."""

from __future__ import annotations

from collections.abc import Sequence
import onnx_ir as ir
from onnxscript import opset18 as op
from dispatcher.traced_values import int64_vector
from onnxscript.function_libs.torch_lib.tensor_typing import INT64, TTensor
from dispatcher.functions.complex.movement import _complex_op, _complex_shape, _is_complex_dtype, _like_filled, _with_pair

# -- creation from a complex tensor -------------------------------------------------------


@_complex_op("aten::zeros_like")
def complex_zeros_like(
    self: TTensor, dtype: int = -1, layout: str = "", device: str = "", pin_memory: bool = False, memory_format: str = ""
) -> TTensor:
    if dtype is None or dtype == -1 or _is_complex_dtype(dtype):
        return _like_filled(op.Shape(self), 0.0, self, -1 if dtype is None else dtype)
    return _like_filled(_complex_shape(self), 0.0, self, dtype)


@_complex_op("aten::ones_like")
def complex_ones_like(
    self: TTensor, dtype: int = -1, layout: str = "", device: str = "", pin_memory: bool = False, memory_format: str = ""
) -> TTensor:
    dtype = -1 if dtype is None else dtype
    if dtype == -1 or _is_complex_dtype(dtype):
        return _like_filled(op.Shape(self), 1.0, self, dtype)
    return _like_filled(_complex_shape(self), 1.0, self, dtype)


@_complex_op("aten::empty_like")
def complex_empty_like(
    self: TTensor, dtype: int = -1, layout: str = "", device: str = "", pin_memory: bool = False, memory_format: str = ""
) -> TTensor:
    return complex_zeros_like(self, dtype)


@_complex_op("aten::full_like")
def complex_full_like(
    self: TTensor, fill_value, dtype: int = -1, layout: str = "", device: str = "", pin_memory: bool = False, memory_format: str = ""
) -> TTensor:
    dtype = -1 if dtype is None else dtype
    if dtype == -1 or _is_complex_dtype(dtype):
        return _like_filled(op.Shape(self), fill_value, self, dtype)
    return _like_filled(_complex_shape(self), fill_value, self, dtype)


def _new_filled(self, size, fill_value, dtype):
    dtype = -1 if dtype is None else dtype
    if dtype == -1 or _is_complex_dtype(dtype):
        return _like_filled(_with_pair(size), fill_value, self, dtype)
    return _like_filled(int64_vector(size) if not isinstance(size, ir.Value) else size, fill_value, self, dtype)


@_complex_op("aten::new_full")
def complex_new_full(
    self: TTensor, size: Sequence[INT64], fill_value, dtype: int = -1, layout: str = "", device: str = "", pin_memory: bool = False
) -> TTensor:
    return _new_filled(self, size, fill_value, dtype)


@_complex_op("aten::new_zeros", "aten::new_empty")
def complex_new_zeros(
    self: TTensor, size: Sequence[INT64], dtype: int = -1, layout: str = "", device: str = "", pin_memory: bool = False
) -> TTensor:
    return _new_filled(self, size, 0.0, dtype)


@_complex_op("aten::new_ones")
def complex_new_ones(
    self: TTensor, size: Sequence[INT64], dtype: int = -1, layout: str = "", device: str = "", pin_memory: bool = False
) -> TTensor:
    return _new_filled(self, size, 1.0, dtype)
