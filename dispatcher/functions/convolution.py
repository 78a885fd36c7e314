"""``conv1d``, ``conv2d`` and ``conv3d`` on real tensors as one ONNX ``Conv``, bias or not.

torchlib builds the bias a bias-free convolution lacks as zeros of shape ``[out, 2]``
for ``conv3d`` (the shape its complex variant needs, where the trailing 2 holds the real
and imaginary parts): ONNX accepts the model and onnxruntime refuses it at run time
("bias must be a 1D tensor of size output_channels"). ``Conv``'s bias is optional, so a
missing bias is simply left out, for every dimension: no zeros are made, expanded or
added. Padding is ints (one per spatial dim, or one for all) or PyTorch's strings
``"valid"`` and ``"same"`` (the ``.padding`` overloads); an unbatched input gets a batch
of one for the ``Conv``. :data:`CONVOLUTION_FUNCTIONS` lists (qualified ATen names, function).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from onnxscript import opset18 as op

from dispatcher.function_table import FunctionTable

__all__ = ["CONVOLUTION_FUNCTIONS", "CONVOLUTION_DOMAIN"]

CONVOLUTION_DOMAIN = "pkg.fx2onnx.convolution"
_TABLE = FunctionTable(CONVOLUTION_DOMAIN)

CONVOLUTION_FUNCTIONS = _TABLE.entries


def _per_dim(value: Any, dims: int) -> list[int]:
    """PyTorch's int-or-list convolution arguments as one int per spatial dim."""
    if isinstance(value, int):
        return [value] * dims
    values = list(value)
    return values * dims if len(values) == 1 else values


def _pads(padding: Any, weight: Any, dilations: list[int], dims: int) -> list[int]:
    """ONNX pads (all begins, then all ends) for PyTorch's padding argument."""
    if padding == "valid":
        return [0] * (2 * dims)
    if padding == "same":
        # PyTorch pads the odd extra element at the end, as ONNX's SAME_UPPER does
        kernel = list(weight.shape[2:])
        totals = [d * (k - 1) for d, k in zip(dilations, kernel)]
        return [t // 2 for t in totals] + [t - t // 2 for t in totals]
    pads = _per_dim(padding, dims)
    return pads + pads


def _convolution(input, weight, bias, stride, padding, dilation, groups: int, dims: int):
    dilations = _per_dim(dilation, dims)
    attributes = dict(
        strides=_per_dim(stride, dims),
        pads=_pads(padding, weight, dilations, dims),
        dilations=dilations,
        group=groups,
    )
    unbatched = len(input.shape) == dims + 1
    if unbatched:
        input = op.Unsqueeze(input, op.Constant(value_ints=[0]))
    if bias is None:
        result = op.Conv(input, weight, **attributes)
    else:
        result = op.Conv(input, weight, bias, **attributes)
    if unbatched:
        result = op.Squeeze(result, op.Constant(value_ints=[0]))
    return result


@_TABLE.op("aten::conv1d", "aten::conv1d.padding")
def conv1d(
    input: Any,
    weight: Any,
    bias: Optional[Any] = None,
    stride: Sequence[int] = (1,),
    padding: Any = (0,),
    dilation: Sequence[int] = (1,),
    groups: int = 1,
) -> Any:
    return _convolution(input, weight, bias, stride, padding, dilation, groups, 1)


@_TABLE.op("aten::conv2d", "aten::conv2d.padding")
def conv2d(
    input: Any,
    weight: Any,
    bias: Optional[Any] = None,
    stride: Sequence[int] = (1, 1),
    padding: Any = (0, 0),
    dilation: Sequence[int] = (1, 1),
    groups: int = 1,
) -> Any:
    return _convolution(input, weight, bias, stride, padding, dilation, groups, 2)


@_TABLE.op("aten::conv3d", "aten::conv3d.padding")
def conv3d(
    input: Any,
    weight: Any,
    bias: Optional[Any] = None,
    stride: Sequence[int] = (1, 1, 1),
    padding: Any = (0, 0, 0),
    dilation: Sequence[int] = (1, 1, 1),
    groups: int = 1,
) -> Any:
    return _convolution(input, weight, bias, stride, padding, dilation, groups, 3)
