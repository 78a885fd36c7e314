"""Decompose only the operators that no registered ONNX function covers."""

from __future__ import annotations

import torch

from dispatcher import OnnxRegistry


def _has_exact_function(registry: OnnxRegistry, op: torch._ops.OpOverload) -> bool:
    """An ONNX function registered for this very overload. A function registered for the
    default overload does not cover e.g. `aten::min.other`, which PyTorch decomposes."""
    namespace, _, rest = op.name().partition("::")
    name, _, overload = rest.partition(".")
    return registry.is_registered_op(namespace, name, overload or "default")


def onnx_decomposition_table(registry: OnnxRegistry) -> dict:
    """torch.export's default decompositions minus every operator the registry implements,
    so `aten.linear`, `aten.layer_norm`, `aten.scaled_dot_product_attention`... stay whole."""
    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if _has_exact_function(registry, op):
            del table[op]
    return table


def _needs_decomposition(program: torch.export.ExportedProgram, table: dict, registry: OnnxRegistry) -> bool:
    for node in program.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            if node.target in table or not registry.is_supported(node.target):
                return True
    return False


def decompose_unsupported(program: torch.export.ExportedProgram, registry: OnnxRegistry) -> torch.export.ExportedProgram:
    """Run decompositions only when some operator needs one; otherwise keep the program
    as it is (no re-trace of the whole graph)."""
    table = onnx_decomposition_table(registry)
    if not _needs_decomposition(program, table, registry):
        return program
    return program.run_decompositions(table)
