"""Rename symbolic dims throughout a model: graph inputs and outputs, every node's outputs,
module-function bodies and sub-graphs. A dim that is an expression of symbols
(``input_ids_dim_1+past_dim_2``) has each symbol renamed, then the whole expression when
``expressions`` names it (``sequence_length+past_sequence_length`` ->
``total_sequence_length``)."""

from __future__ import annotations

import re
from collections.abc import Mapping

import onnx_ir as ir

from fx2onnx.onnx_passes.model_graphs import model_graphs

_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def _renamed(text: str, symbols: Mapping[str, str], expressions: Mapping[str, str]) -> str:
    new = _SYMBOL.sub(lambda match: symbols.get(match.group(0), match.group(0)), text)
    return expressions.get(new, new)


def _rename_value(value: ir.Value, symbols: Mapping[str, str], expressions: Mapping[str, str]) -> None:
    if value.shape is None:
        return
    dims = [
        ir.SymbolicDim(_renamed(dim.value, symbols, expressions)) if isinstance(dim, ir.SymbolicDim) and dim.value else dim
        for dim in value.shape
    ]
    value.shape = ir.Shape(dims)


def rename_dims(model: ir.Model, symbols: Mapping[str, str], expressions: Mapping[str, str] | None = None) -> None:
    """Rename the symbolic dims of ``model`` in place (see the module docstring)."""
    expressions = expressions or {}
    for container in model_graphs(model):
        for value in [*container.inputs, *container.outputs]:
            _rename_value(value, symbols, expressions)
        for node in container:
            for value in node.outputs:
                _rename_value(value, symbols, expressions)


__all__ = ["rename_dims"]
