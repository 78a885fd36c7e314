"""Decompose only the operators that no registered ONNX function covers."""

from __future__ import annotations

import torch

from dispatcher import OnnxRegistry


def onnx_decomposition_table(registry: OnnxRegistry) -> dict:
    """torch.export's default decompositions minus every operator the registry implements,
    so `aten.linear`, `aten.layer_norm`, `aten.scaled_dot_product_attention`... stay whole."""
    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if registry.is_supported(op):
            del table[op]
    return table


def needs_decomposition(program: torch.export.ExportedProgram, registry: OnnxRegistry) -> bool:
    for node in program.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            if not registry.is_supported(node.target):
                return True
    return False


def decompose_unsupported(program: torch.export.ExportedProgram, registry: OnnxRegistry) -> torch.export.ExportedProgram:
    """Run decompositions only when some operator needs one; otherwise keep the program
    as it is (no re-trace of the whole graph)."""
    if not needs_decomposition(program, registry):
        return program
    return program.run_decompositions(onnx_decomposition_table(registry))
