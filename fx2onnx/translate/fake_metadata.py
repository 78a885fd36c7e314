"""ONNX dtypes and shapes from the FakeTensor values that torch.export attaches to nodes.

- a tensor gives its dtype and shape; a SymInt size becomes a named symbolic dim;
- a complex tensor becomes a real tensor with a trailing dim of 2, marked complex;
- SymInt / SymFloat / SymBool become 0-d INT64 / DOUBLE / BOOL tensors.

Symbolic dims get readable names: the `torch.export.Dim` name when the user gave one
(a derived Dim such as `2*half` names its root, `half`), otherwise `<input>_dim_<i>`; a data-dependent size (the length of `nonzero`'s result, a
value read with `.item()`) is named after the FX node that first produces it
(`nonzero_dim_0`, `item`); derived sizes are written as expressions of those names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import onnx_ir as ir
import sympy
import torch

from dispatcher import torch_dtype_to_onnx
from fx2onnx.capture.dynamic_dims.names import dim_name


@dataclass(frozen=True)
class OnnxTypeInfo:
    dtype: ir.DataType
    shape: ir.Shape
    is_complex: bool = False


class SymbolNamer:
    """Maps torch's symbols (`s77`) to the names users read in the ONNX file."""

    def __init__(self) -> None:
        self._names: dict[sympy.Symbol, str] = {}
        self._taken: set[str] = set()
        # the text of each expression whose symbols are all named (its text is final);
        # printing symbolic sizes is most of the translation's time otherwise
        self._texts: dict[sympy.Expr, str] = {}

    def name_symbol(self, size: Any, name: str) -> None:
        """Name the symbol behind a SymInt size, unless it already has a name; a name
        another symbol holds gets a numeric suffix."""
        if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
            self._name(size.node.expr, name)

    def name_user_dim(self, size: Any, name: str) -> None:
        """Name the symbol behind a dim the user named with a `torch.export.Dim`: the
        dim's own symbol or, for a derived Dim (`2*half`, `batch + 1`, named after its
        root), the one symbol of its expression, so that every size derived from it reads
        as an expression of the user's name (`4*half`, not `4*s44`)."""
        if isinstance(size, torch.SymInt) and len(size.node.expr.free_symbols) == 1:
            (symbol,) = size.node.expr.free_symbols
            self._name(symbol, name)

    def _name(self, symbol: sympy.Symbol, name: str) -> None:
        if symbol in self._names:
            return
        unique, suffix = name, 1
        while unique in self._taken:
            suffix += 1
            unique = f"{name}_{suffix}"
        self._names[symbol] = unique
        self._taken.add(unique)

    def name_new_symbols(self, value: Any, base: str) -> None:
        """Name the symbols a node's result introduces (data-dependent sizes): dim `i` of a
        tensor becomes `<base>_dim_<i>`, a SymInt becomes `<base>`."""
        if isinstance(value, torch.Tensor):
            for index, size in enumerate(value.shape):
                self.name_symbol(size, dim_name(base, index))
        else:
            self.name_symbol(value, base)

    def dim(self, size: Any) -> int | str:
        if isinstance(size, int):
            return size
        expr = size.node.expr if isinstance(size, torch.SymInt) else sympy.sympify(size)
        if expr.is_Integer:
            return int(expr)
        text = self._texts.get(expr)
        if text is not None:
            return text
        renamed = self.named_expr(expr)
        if renamed is not None:
            text = self._texts[expr] = str(renamed).replace(" ", "")
            return text
        return str(expr).replace(" ", "")

    def named_expr(self, size: Any) -> sympy.Expr | None:
        """A symbolic size as an expression of the names users read (`x_dim_0 + 1`);
        None for a static size or one with an unnamed symbol."""
        expr = size.node.expr if isinstance(size, torch.SymInt) else size
        if not isinstance(expr, sympy.Expr) or not expr.free_symbols or not all(s in self._names for s in expr.free_symbols):
            return None
        return expr.xreplace({s: sympy.Symbol(self._names[s]) for s in expr.free_symbols})

    def shape(self, sizes: Any) -> ir.Shape:
        return ir.Shape([self.dim(s) for s in sizes])


def onnx_type_of(value: Any, namer: SymbolNamer) -> OnnxTypeInfo | None:
    """The ONNX type of a node's meta["val"], or None for values that are not tensors."""
    if isinstance(value, torch.Tensor):
        shape = namer.shape(value.shape)
        if value.is_complex():
            return OnnxTypeInfo(torch_dtype_to_onnx(value.dtype), ir.Shape([*shape, 2]), True)
        return OnnxTypeInfo(torch_dtype_to_onnx(value.dtype), shape)
    if isinstance(value, (torch.SymBool, bool)):
        return OnnxTypeInfo(ir.DataType.BOOL, ir.Shape([]))
    if isinstance(value, (torch.SymInt, int)):
        return OnnxTypeInfo(ir.DataType.INT64, ir.Shape([]))
    if isinstance(value, (torch.SymFloat, float)):
        return OnnxTypeInfo(ir.DataType.DOUBLE, ir.Shape([]))
    return None


def apply_type(value: ir.Value, info: OnnxTypeInfo | None) -> None:
    """Set dtype, shape and the complex flag of a graph value from FX metadata."""
    if info is None:
        return
    value.dtype = info.dtype
    value.shape = info.shape
    if hasattr(value, "is_complex"):
        value.is_complex = info.is_complex
