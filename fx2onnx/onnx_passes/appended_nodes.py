"""Nodes built one call each, appended to a list in order and named under one prefix: a
computation of many small nodes (a guard's condition, the exact form beside a kernel)
written as a few lines of calls, its nodes then inserted where they belong."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir


class AppendedNodes:
    """Nodes appended to a list, each made with one call."""

    def __init__(self, prefix: str) -> None:
        self.nodes: list[ir.Node] = []
        self.prefix = prefix

    def __call__(self, op_type: str, inputs: list[ir.Value | None], outputs: int = 1, **attributes: object) -> ir.Value:
        node = ir.node(op_type, inputs, attributes=attributes, num_outputs=outputs,
                       name=f"{self.prefix}/{op_type}_{len(self.nodes)}")
        for index, value in enumerate(node.outputs):
            value.name = f"{self.prefix}/{op_type}_{len(self.nodes)}_{index}"
        self.nodes.append(node)
        return node.outputs[0] if outputs == 1 else node.outputs

    def constant(self, value: object, dtype: np.dtype = np.int64) -> ir.Value:
        return self("Constant", [], value=ir.tensor(np.asarray(value, dtype=dtype)))
