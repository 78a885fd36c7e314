"""Adaptive pooling: ``aten::adaptive_max_pool1d/2d/3d`` and ``_adaptive_avg_pool2d/3d`` for any output size.

Output position ``i`` of a spatial dim of input size ``L`` and output size ``O`` covers
the input window ``[floor(i*L/O), ceil((i+1)*L/O))``, as in PyTorch; windows may overlap
and differ in length when ``O`` does not divide ``L``. The windows' flat positions in
the spatial plane are computed in the graph from the input's shape (dynamic sizes work)
as one (O1, ..., Ok, K) tensor, K the largest window, shorter windows repeating their
last position (which changes neither the maximum nor its first occurrence). One
``Gather`` reads every window; the maximum's index is its first occurrence, or the
window's first NaN (PyTorch propagates NaN, ``ArgMax`` skips it), as a flat index in
the input's spatial plane like PyTorch's. The average of a window counts its own
positions only (the repeats weigh zero).

:data:`POOLING_FUNCTIONS` lists (qualified ATen names, function); the registry adds
them after torchlib's functions.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
from onnxscript import opset18 as op

from dispatcher.function_table import FunctionTable
from onnxscript.function_libs.torch_lib.tensor_typing import INT64, TReal

__all__ = ["POOLING_FUNCTIONS", "POOLING_DOMAIN"]

POOLING_DOMAIN = "pkg.fx2onnx.pooling"
_TABLE = FunctionTable(POOLING_DOMAIN)

POOLING_FUNCTIONS = _TABLE.entries



def _window_indices(size, out):
    """(O, K) input positions of the windows of one spatial dim (sizes as 0-d INT64):
    output ``i`` covers ``[floor(i*L/O), ceil((i+1)*L/O))``; K is the longest window and
    a shorter one repeats its last position. Also (O, K) booleans: which positions are
    the window's own (not repeats)."""
    zero, one = op.Constant(value_int=0), op.Constant(value_int=1)
    steps = op.Range(zero, out, one)
    starts = op.Div(op.Mul(steps, size), out)  # non-negative: Div is floor
    ends = op.Div(op.Sub(op.Add(op.Mul(op.Add(steps, one), size), out), one), out)
    longest = op.ReduceMax(op.Sub(ends, starts), keepdims=0)
    offsets = op.Unsqueeze(op.Range(zero, longest, one), op.Constant(value_ints=[0]))
    last = op.Constant(value_ints=[1])
    unclamped = op.Add(op.Unsqueeze(starts, last), offsets)
    window_ends = op.Unsqueeze(ends, last)
    return op.Min(unclamped, op.Sub(window_ends, one)), op.Less(unclamped, window_ends)


def _window_positions(sizes: list, outs: list):
    """(O1, ..., Ok, K) flat positions in the spatial plane of every window: the
    positions of each dim, weighted by its stride, summed over a (O1..Ok, K1..Kk) grid;
    and (O1, ..., Ok, K) booleans marking the positions that are the window's own."""
    rank = len(sizes)
    positions = None
    own = None
    stride = op.Constant(value_int=1)
    for d in reversed(range(rank)):
        indices, valid = _window_indices(sizes[d], outs[d])
        others = [a for a in range(2 * rank) if a not in (d, rank + d)]
        if others:
            indices = op.Unsqueeze(indices, op.Constant(value_ints=others))
            valid = op.Unsqueeze(valid, op.Constant(value_ints=others))
        weighted = op.Mul(indices, stride)
        positions = weighted if positions is None else op.Add(positions, weighted)
        own = valid if own is None else op.And(own, valid)
        stride = op.Mul(stride, sizes[d])
    grid = op.Concat(*[op.Reshape(o, op.Constant(value_ints=[1])) for o in outs], op.Constant(value_ints=[-1]), axis=0)
    return op.Reshape(positions, grid), op.Reshape(op.Expand(own, op.Shape(positions)), grid)


def _spatial_sizes(x, output_size: Sequence[int]):
    rank = len(output_size)
    shape = op.Shape(x)
    sizes = [op.Gather(shape, op.Constant(value_int=axis)) for axis in range(-rank, 0)]
    outs = [size if out is None else op.Constant(value_int=out) for size, out in zip(sizes, output_size)]
    leading = op.Slice(shape, op.Constant(value_ints=[0]), op.Constant(value_ints=[-rank]))
    plane = op.Reshape(x, op.Concat(leading, op.Constant(value_ints=[-1]), axis=0))
    return sizes, outs, plane


def _adaptive_max_pool(x, output_size: Sequence[int]):
    sizes, outs, plane = _spatial_sizes(x, output_size)
    positions, _ = _window_positions(sizes, outs)
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


@_TABLE.op("aten::_adaptive_avg_pool2d", "aten::_adaptive_avg_pool3d")
def adaptive_avg_pool(self: TReal, output_size: Sequence[int]) -> TReal:
    """The mean of each window: its own positions only (repeats weigh zero). (PyTorch's
    decomposition of the 2-d kernel picks its window length by the example's sizes.)"""
    sizes, outs, plane = _spatial_sizes(self, output_size)
    positions, own = _window_positions(sizes, outs)
    windows = op.Gather(plane, positions, axis=-1)  # (..., O1, O2, O3, K)
    weights = op.CastLike(own, self)
    last = op.Constant(value_ints=[-1])
    total = op.ReduceSum(op.Mul(windows, weights), last, keepdims=0)
    return op.Div(total, op.ReduceSum(weights, last, keepdims=0))
