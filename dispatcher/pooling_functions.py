"""Adaptive max pooling: ``aten::adaptive_max_pool1d/2d/3d`` for any output size.

Output position ``i`` of a spatial dim of input size ``L`` and output size ``O`` covers
the input window ``[floor(i*L/O), ceil((i+1)*L/O))``, as in PyTorch; windows may overlap
and differ in length when ``O`` does not divide ``L``. The windows' flat positions in
the spatial plane are computed at export time (the spatial sizes must be static) into
one constant of shape (O1, ..., Ok, K), K the largest window, shorter windows repeating
their last position (which changes neither the maximum nor its first occurrence). One
``Gather`` reads every window; the maximum's index is its first occurrence, or the
window's first NaN (PyTorch propagates NaN, ``ArgMax`` skips it), as a flat index in
the input's spatial plane like PyTorch's.

:data:`POOLING_FUNCTIONS` lists (qualified ATen names, function); the registry adds
them after torchlib's functions.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript import opset18 as op

from dispatcher.function_table import FunctionTable
from onnxscript.function_libs.torch_lib.tensor_typing import INT64, TReal

__all__ = ["POOLING_FUNCTIONS", "POOLING_DOMAIN"]

POOLING_DOMAIN = "pkg.fx2onnx.pooling"
_TABLE = FunctionTable(POOLING_DOMAIN)

POOLING_FUNCTIONS = _TABLE.entries



def _windows(size: int, out: int) -> list[list[int]]:
    """The input positions each output position of one dim covers."""
    return [list(range((i * size) // out, -((-(i + 1) * size) // out))) for i in range(out)]


def _window_positions(sizes: Sequence[int], outs: Sequence[int]) -> np.ndarray:
    """(O1, ..., Ok, K) flat positions in the spatial plane of every window."""
    per_dim = [_windows(size, out) for size, out in zip(sizes, outs)]
    strides = [int(np.prod(sizes[d + 1 :])) for d in range(len(sizes))]
    table = []
    for cell in itertools.product(*per_dim):
        table.append([sum(p * s for p, s in zip(point, strides)) for point in itertools.product(*cell)])
    longest = max(len(row) for row in table)
    padded = [row + [row[-1]] * (longest - len(row)) for row in table]
    return np.array(padded, dtype=np.int64).reshape([*outs, longest])


def _adaptive_max_pool(x, output_size: Sequence[int]):
    rank = len(output_size)
    sizes = list(x.shape[-rank:])
    if not all(isinstance(s, int) for s in sizes):
        raise NotImplementedError("adaptive max pooling needs static spatial sizes")
    outs = [size if out is None else out for size, out in zip(sizes, output_size)]
    positions = op.Constant(value=ir.tensor(_window_positions(sizes, outs)))
    leading = op.Slice(op.Shape(x), op.Constant(value_ints=[0]), op.Constant(value_ints=[-rank]))
    plane = op.Reshape(x, op.Concat(leading, op.Constant(value_ints=[-1]), axis=0))
    windows = op.Gather(plane, positions, axis=-1)  # (..., O1, ..., Ok, K)
    choice = op.ArgMax(windows, axis=-1, keepdims=1)
    if x.dtype.is_floating_point():
        nan = op.Cast(op.IsNaN(windows), to=ir.DataType.FLOAT)
        has_nan = op.ReduceMax(nan, op.Constant(value_ints=[-1]), keepdims=1)
        first_nan = op.ArgMax(nan, axis=-1, keepdims=1)
        choice = op.Where(op.Greater(has_nan, op.Constant(value_float=0.0)), first_nan, choice)
    last = op.Constant(value_ints=[-1])
    values = op.Squeeze(op.GatherElements(windows, choice, axis=-1), last)
    all_positions = op.Expand(positions, op.Shape(windows))
    indices = op.Squeeze(op.GatherElements(all_positions, choice, axis=-1), last)
    return values, indices


@_TABLE.op("aten::adaptive_max_pool1d", "aten::adaptive_max_pool2d", "aten::adaptive_max_pool3d")
def adaptive_max_pool(self: TReal, output_size: Sequence[int]) -> tuple[TReal, INT64]:
    return _adaptive_max_pool(self, output_size)
