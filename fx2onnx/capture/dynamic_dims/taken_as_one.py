"""Sizes computed from dynamic dims that the capture took as 1.

Where an elementwise operator broadcasts an operand whose size is a symbolic expression
(a feature map's height, `(H + 31) // 32 // 4`), and that expression is 1 for the
example, torch's broadcasting may take it as 1 for good: the result's size is the
literal 1 and no guard on the inputs says so. The ONNX model then runs at the example's
sizes and fails (or computes something else) where that expression is larger. This finds
such places after capture, so the user hears of them at export, with the line.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.fx


def _sizes(value: Any) -> tuple[Any, ...] | None:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def _varies(size: Any) -> bool:
    return isinstance(size, torch.SymInt) and bool(size.node.expr.free_symbols)


def sizes_taken_as_one(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The elementwise nodes whose result has size 1 in a dim where an operand's size is
    a symbolic expression of the inputs (broadcast as if it were 1)."""
    found = []
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if torch.Tag.pointwise not in node.target.tags:
            continue
        result = _sizes(node.meta.get("val"))
        if result is None:
            continue
        operands = [_sizes(arg.meta.get("val")) for arg in node.all_input_nodes]
        for sizes in (s for s in operands if s is not None):
            # broadcasting aligns sizes from the last dim
            pairs = itertools.zip_longest(reversed(result), reversed(sizes))
            if any(isinstance(out, int) and out == 1 and _varies(size) for out, size in pairs):
                found.append(node)
                break
    return found
