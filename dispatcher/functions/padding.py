"""``aten::pad`` in every mode, written so that onnxruntime runs every case PyTorch accepts.

ONNX ``Pad`` has the four modes PyTorch has (``edge`` for ``replicate``, ``wrap`` for
``circular``), but onnxruntime refuses ``edge`` when negative pads remove a whole side
before padding ("zero effective input extent") and ``wrap`` on tensors with an empty
dim. Both modes are an index computation along each padded dim, which is how they are
written here: output position ``i`` reads input position ``i - left``, clamped into the
input for ``replicate``; for ``circular``, negative pads first crop the input (as
PyTorch does) and the positions are taken modulo the cropped length (one ``Gather`` per
padded dim). ``constant`` and ``reflect`` use ``Pad`` (which handles them, negative pads
included), as do pads only known at run time. :data:`PADDING_FUNCTIONS` lists
(qualified ATen names, function).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from onnxscript import opset18 as op

from dispatcher.function_table import FunctionTable
from dispatcher.traced_values import int64_vector, scalar_like

__all__ = ["PADDING_FUNCTIONS", "PADDING_DOMAIN"]

PADDING_DOMAIN = "pkg.fx2onnx.padding"
_TABLE = FunctionTable(PADDING_DOMAIN)

PADDING_FUNCTIONS = _TABLE.entries

_LAST = 2**63 - 1  # a Slice end past every dim
_ONNX_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def _onnx_pads(pad: Sequence[Any], rank: int):
    """PyTorch's pads (last dim first, (left, right) pairs) as ONNX's ``[begins..., ends...]``."""
    pairs = [(pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)]
    pairs += [(0, 0)] * (rank - len(pairs))
    per_axis = list(reversed(pairs))  # axis 0 first
    ordered = [left for left, _ in per_axis] + [right for _, right in per_axis]
    return int64_vector(ordered)


def _gather_padded(x, axis: int, left: int, right: int, circular: bool):
    """Pad (or crop, for negative amounts) ``x`` along ``axis`` by reading indices."""
    if circular and (left < 0 or right < 0):
        # PyTorch crops first, then wraps around what is left.
        start, stop = max(-left, 0), -max(-right, 0)
        x = op.Slice(
            x,
            op.Constant(value_ints=[start]),
            op.Constant(value_ints=[stop if stop else _LAST]),
            op.Constant(value_ints=[axis]),
        )
        left, right = max(left, 0), max(right, 0)
    length = op.Squeeze(op.Shape(x, start=axis, end=axis + 1))
    positions = op.Range(
        op.Constant(value_int=-left), op.Add(length, op.Constant(value_int=right)), op.Constant(value_int=1)
    )
    if circular:
        index = op.Mod(positions, length)  # integer Mod takes the divisor's sign: 0 <= index < length
    else:
        last = op.Sub(length, op.Constant(value_int=1))
        index = op.Min(op.Max(positions, op.Constant(value_int=0)), last)
    return op.Gather(x, index, axis=axis)


@_TABLE.op("aten::pad")
def pad(self: Any, pad: Sequence[Any], mode: str = "constant", value: Optional[float] = None) -> Any:
    rank = len(self.shape)
    if mode in ("replicate", "circular") and all(isinstance(p, int) for p in pad):
        result = self
        for i in range(len(pad) // 2):
            left, right = pad[2 * i], pad[2 * i + 1]
            if left or right:
                result = _gather_padded(result, rank - 1 - i, left, right, circular=mode == "circular")
        return op.Identity(result) if result is self else result
    if value is not None and mode == "constant":
        fill = scalar_like(value, self)
        return op.Pad(self, _onnx_pads(pad, rank), fill, mode="constant")
    return op.Pad(self, _onnx_pads(pad, rank), mode=_ONNX_MODES[mode])
