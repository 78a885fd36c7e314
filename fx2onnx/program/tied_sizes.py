"""Sizes the export tied together across inputs, checked at call time before onnxruntime.

torch.export gives one symbol to dims the model requires equal (`x: [x_dim_0, 3]`,
`y: [x_dim_0, 4]` for a model that adds along it) and writes a dim it can compute from
others as an expression (`mask: [batch, past_dim_1 + new_dim_1]`). onnxruntime checks
neither: sizes that break them reach a kernel and come back as its broadcast error, or as
a wrong result. `TiedSizes.check` binds each symbol to the first input dim that carries it
alone and raises an `UnsupportedInputError` naming both inputs and the dim where a later
dim disagrees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from fx2onnx.errors import UnsupportedInputError


@dataclass(frozen=True)
class TiedSizes:
    """Per ONNX input, in order, per dim: its expression of the named symbols (a
    `sympy.Symbol` for a dim of its own), None where it is static or unknown."""

    dims: tuple[tuple[sympy.Expr | None, ...], ...]

    @classmethod
    def of(cls, dims: Sequence[Sequence[Any]]) -> TiedSizes | None:
        """The check for these dims; None when no symbol appears twice (nothing tied)."""
        seen: list[sympy.Symbol] = [s for input_dims in dims for e in input_dims if e is not None for s in e.free_symbols]
        if len(seen) == len(set(seen)):
            return None
        return cls(tuple(tuple(input_dims) for input_dims in dims))

    def check(self, names: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
        """Raise an UnsupportedInputError for the first dim whose size breaks a tie."""
        bound: dict[sympy.Symbol, tuple[int, str, int]] = {}
        for name, tensor, dims in zip(names, tensors, self.dims):
            for index, expr in enumerate(dims[: tensor.dim()]):
                if not isinstance(expr, sympy.Symbol):
                    continue
                size = int(tensor.shape[index])
                if expr not in bound:
                    bound[expr] = (size, name, index)
                    continue
                first_size, first_name, first_index = bound[expr]
                if size != first_size:
                    raise UnsupportedInputError(
                        f"Input '{name}' has size {size} in dim {index}, and input '{first_name}' has size {first_size} "
                        f"in dim {first_index}; the program was exported with one dim '{expr}' for both (the model "
                        "needs them equal). Give inputs whose sizes there agree."
                    )
        for name, tensor, dims in zip(names, tensors, self.dims):
            for index, expr in enumerate(dims[: tensor.dim()]):
                if expr is None or isinstance(expr, sympy.Symbol) or not expr.free_symbols <= bound.keys():
                    continue
                expected = expr.xreplace({symbol: sympy.Integer(bound[symbol][0]) for symbol in expr.free_symbols})
                size = int(tensor.shape[index])
                if expected.is_Integer and int(expected) != size:
                    sources = ", ".join(
                        f"{symbol} = {bound[symbol][0]} from input '{bound[symbol][1]}' dim {bound[symbol][2]}"
                        for symbol in sorted(expr.free_symbols, key=str)
                    )
                    raise UnsupportedInputError(
                        f"Input '{name}' has size {size} in dim {index}; the program was exported with the size "
                        f"'{str(expr).replace(' ', '')}' there, which is {int(expected)} for these inputs ({sources}). "
                        "Give inputs whose sizes agree."
                    )


__all__ = ["TiedSizes"]
