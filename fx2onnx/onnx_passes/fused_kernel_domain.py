"""Fused kernels into the standard domain, once the opset is final.

The translation writes the kernels that fx_passes/fused_kernels chose in a domain of
their own (they are newer than the opset the model is built at, and the opset
conversion must not touch them); here they become the standard operators they are.
"""

from __future__ import annotations

import onnx_ir as ir

from dispatcher.functions.fused import STANDARD_LATER_DOMAIN
from fx2onnx.onnx_passes.model_graphs import model_nodes


def lower_fused_kernels(model: ir.Model) -> int:
    """Move every node of the kernels' domain into the standard one; returns how many."""
    moved = 0
    for node in model_nodes(model):
        if node.domain == STANDARD_LATER_DOMAIN:
            node.domain = ""
            moved += 1
    if moved:
        model.opset_imports.pop(STANDARD_LATER_DOMAIN, None)
        for function in model.functions.values():
            function.opset_imports.pop(STANDARD_LATER_DOMAIN, None)
    return moved
