"""Small building blocks shared by fx2onnx's own ONNX function tables (traced style)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx_ir as ir
from onnxscript import opset18 as op

__all__ = ["int64_vector", "keep_rank_of", "scalar_like"]


def int64_vector(items: Sequence[Any] | ir.Value) -> Any:
    """A 1-D INT64 tensor from Python ints and 0-d/1-d values (SymInts), or from a value."""
    if isinstance(items, ir.Value):
        return op.Cast(items, to=ir.DataType.INT64.value)
    items = list(items)
    if all(isinstance(i, int) for i in items):
        return op.Constant(value_ints=items)
    pieces = [
        op.Constant(value_ints=[i])
        if isinstance(i, int)
        else op.Reshape(op.Cast(i, to=ir.DataType.INT64.value), op.Constant(value_ints=[-1]))
        for i in items
    ]
    return op.Concat(*pieces, axis=0)


def scalar_like(value: float, like: Any) -> Any:
    """The number ``value`` as a 0-d tensor of ``like``'s element type."""
    return op.CastLike(op.Constant(value_float=float(value)), like)


def keep_rank_of(x: Any, reduced: Any, keepdim: bool) -> Any:
    """``reduced``, a reduction of every element of ``x`` computed without kept dims, with
    ``x``'s rank when ``keepdim`` (all sizes 1), as PyTorch gives it for a reduction
    without ``dim`` and ``keepdim=True``."""
    if not keepdim:
        return reduced
    return op.Reshape(reduced, op.Constant(value_ints=[1] * len(x.shape)))
