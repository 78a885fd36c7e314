"""``avg_pool2d`` and ``avg_pool3d`` with PyTorch's ``divisor_override``.

ONNX ``AveragePool`` divides by the window size (with or without padding); PyTorch's
``divisor_override`` divides the window's sum by a given number instead. The sum is a
convolution with a kernel of ones over every channel apart; with ``ceil_mode`` the last
windows reach past the padded input, which extra zero padding on the far side gives
(zeros add nothing to a sum). Without ``divisor_override`` the functions are
``AveragePool``. :data:`AVERAGE_POOL_FUNCTIONS` lists (qualified ATen names, function).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Optional

from onnxscript import opset18 as op

from dispatcher.function_table import FunctionTable
from dispatcher.traced_values import scalar_like

__all__ = ["AVERAGE_POOL_FUNCTIONS", "AVERAGE_POOL_DOMAIN"]

AVERAGE_POOL_DOMAIN = "pkg.fx2onnx.average_pool"
_TABLE = FunctionTable(AVERAGE_POOL_DOMAIN)

AVERAGE_POOL_FUNCTIONS = _TABLE.entries


def _per_dim(value: Any, dims: int) -> list[int]:
    """PyTorch's int-or-list pooling arguments as one int per spatial dim."""
    if isinstance(value, int):
        return [value] * dims
    values = list(value)
    return values * dims if len(values) == 1 else values


def _ceil_extra(size: int, kernel: int, stride: int, pad: int) -> int:
    """Zero padding past the far side that makes a floor-mode window count equal
    PyTorch's ceil-mode count (a last window must start inside the input or left pad)."""
    count = math.ceil((size + 2 * pad - kernel) / stride) + 1
    if (count - 1) * stride >= size + pad:
        count -= 1
    return max(0, (count - 1) * stride + kernel - (size + 2 * pad))


def _window_sums(x, spatial: list[Any], kernel: list[int], strides: list[int], pads: list[int], ceil_mode: bool):
    """Sum over each window, channels apart (x is batched: N, C, *spatial)."""
    if not all(isinstance(s, int) for s in spatial):
        # Sizes unknown at export: the sum from the average over the full window.
        area = scalar_like(math.prod(kernel), x)
        mean = op.AveragePool(
            x, kernel_shape=kernel, strides=strides, pads=pads + pads, ceil_mode=int(ceil_mode), count_include_pad=1
        )
        return op.Mul(mean, area)
    extra = [_ceil_extra(s, k, st, p) if ceil_mode else 0 for s, k, st, p in zip(spatial, kernel, strides, pads)]
    channels_apart = op.Reshape(x, op.Constant(value_ints=[-1, 1, *spatial]))
    ones = op.Expand(scalar_like(1.0, x), op.Constant(value_ints=[1, 1, *kernel]))
    sums = op.Conv(channels_apart, ones, strides=strides, pads=pads + [p + e for p, e in zip(pads, extra)])
    batch_and_channels = op.Shape(x, start=0, end=2)
    return op.Reshape(sums, op.Concat(batch_and_channels, op.Shape(sums, start=2), axis=0))


def _average_pool(
    x, dims: int, kernel_size, stride, padding, ceil_mode: bool, count_include_pad: bool, divisor_override
):
    kernel = _per_dim(kernel_size, dims)
    strides = _per_dim(stride, dims) if stride else kernel
    pads = _per_dim(padding, dims)
    spatial = list(x.shape[-dims:])
    unbatched = len(x.shape) == dims + 1
    if unbatched:
        x = op.Unsqueeze(x, op.Constant(value_ints=[0]))
    if divisor_override is None:
        result = op.AveragePool(
            x,
            kernel_shape=kernel,
            strides=strides,
            pads=pads + pads,
            ceil_mode=int(ceil_mode),
            count_include_pad=int(count_include_pad),
        )
    else:
        divisor = scalar_like(divisor_override, x)
        result = op.Div(_window_sums(x, spatial, kernel, strides, pads, ceil_mode), divisor)
    if unbatched:
        result = op.Squeeze(result, op.Constant(value_ints=[0]))
    return result


@_TABLE.op("aten::avg_pool2d")
def avg_pool2d(
    self: Any,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: Optional[int] = None,
) -> Any:
    return _average_pool(self, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@_TABLE.op("aten::avg_pool3d")
def avg_pool3d(
    self: Any,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0, 0),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: Optional[int] = None,
) -> Any:
    return _average_pool(self, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
