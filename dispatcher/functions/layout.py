"""Operators that only describe memory layout or aliasing, which ONNX does not have.

``prims::view_of`` (an alias PyTorch's decompositions produce, e.g. for
``squeeze`` of several dims that are not 1) is its input; ``aten::empty_permuted`` is
``empty`` whose strides follow a permutation: in ONNX, a tensor of the logical size
(filled with zeros, as fx2onnx writes every ``empty``). :data:`LAYOUT_FUNCTIONS` lists
(qualified ATen names, function).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx_ir as ir
from onnxscript import opset18 as op

from dispatcher.function_table import FunctionTable
from dispatcher.traced_values import int64_vector

__all__ = ["LAYOUT_FUNCTIONS", "LAYOUT_DOMAIN"]

LAYOUT_DOMAIN = "pkg.fx2onnx.layout"
_TABLE = FunctionTable(LAYOUT_DOMAIN)

LAYOUT_FUNCTIONS = _TABLE.entries

_DEFAULT_DTYPE = ir.DataType.FLOAT  # PyTorch's default dtype when none is given


@_TABLE.op("prims::view_of")
def view_of(a: Any) -> Any:
    return op.Identity(a)


@_TABLE.op("aten::empty_permuted")
def empty_permuted(
    size: Sequence[Any],
    physical_layout: Sequence[int],
    dtype: int = -1,
    layout: str = "",
    device: str = "",
    pin_memory: bool = False,
) -> Any:
    element_type = _DEFAULT_DTYPE if dtype in (-1, None) else ir.DataType(dtype)
    zero = op.Constant(value=ir.tensor(0, dtype=element_type))
    return op.Expand(zero, int64_vector(size))
