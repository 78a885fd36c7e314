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


def _listed_dims(dim: Any, rank: int) -> list[int]:
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted({d % rank for d in dims})


def _squeeze_where_one(self: Any, dims: list[int]) -> Any:
    """Squeeze the listed dims whose size is 1, as PyTorch does at every size: a static
    size decides now, a symbolic one at run time (the result's rank then depends on the
    sizes: ONNX ``Squeeze`` would refuse a size that is not 1)."""
    shape = self.shape
    sizes = [shape[d] for d in dims]
    if all(isinstance(size, int) for size in sizes):
        ones = [d for d, size in zip(dims, sizes) if size == 1]
        return op.Squeeze(self, op.Constant(value_ints=ones)) if ones else op.Identity(self)
    rank = len(shape)
    runtime_shape = op.Shape(self)
    listed = op.Cast(op.Constant(value_ints=[1 if d in dims else 0 for d in range(rank)]), to=ir.DataType.BOOL.value)
    is_one = op.Equal(runtime_shape, op.Constant(value_ints=[1]))
    kept = op.Compress(runtime_shape, op.Not(op.And(listed, is_one)), axis=0)
    return op.Reshape(self, kept, allowzero=1)  # a size 0 stays 0, never "copy the input's"


@_TABLE.op("aten::squeeze.dim")
def squeeze_dim(self: Any, dim: int) -> Any:
    if self.shape is None or len(self.shape) == 0:
        return op.Squeeze(self) if self.shape is None else op.Identity(self)
    return _squeeze_where_one(self, _listed_dims(dim, len(self.shape)))


@_TABLE.op("aten::squeeze.dims")
def squeeze_dims(self: Any, dim: Sequence[int]) -> Any:
    if self.shape is None or len(self.shape) == 0:
        return op.Squeeze(self, int64_vector(list(dim))) if self.shape is None else op.Identity(self)
    return _squeeze_where_one(self, _listed_dims(dim, len(self.shape)))


@_TABLE.op("aten::squeeze")
def squeeze(self: Any) -> Any:
    if self.shape is None or len(self.shape) == 0:
        return op.Squeeze(self) if self.shape is None else op.Identity(self)
    return _squeeze_where_one(self, list(range(len(self.shape))))
