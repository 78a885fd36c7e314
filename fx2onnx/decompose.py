"""Decompose only the operators that no registered ONNX function covers."""

from __future__ import annotations

import torch

from dispatcher import OnnxRegistry
from fx2onnx.passes.remove_assertions import ASSERTION_OPS

# Building torch.export's table costs ~0.6 s; it depends only on which operators the
# registry covers, so it is kept per set of registered names.
_TABLES: dict[frozenset[str], dict] = {}


def _has_exact_function(registry: OnnxRegistry, op: torch._ops.OpOverload) -> bool:
    """An ONNX function registered for this very overload. A function registered for the
    default overload does not cover e.g. `aten::min.other`, which PyTorch decomposes."""
    namespace, _, rest = op.name().partition("::")
    name, _, overload = rest.partition(".")
    return registry.is_registered_op(namespace, name, overload or "default")


def onnx_decomposition_table(registry: OnnxRegistry) -> dict:
    """torch.export's default decompositions minus every operator the registry implements,
    so `aten.linear`, `aten.layer_norm`, `aten.scaled_dot_product_attention`... stay whole."""
    key = frozenset(registry.all_registered_ops())
    table = _TABLES.get(key)
    if table is None:
        table = torch.export.default_decompositions()
        for op in list(table.keys()):
            if _has_exact_function(registry, op):
                del table[op]
        _TABLES[key] = table
    return table.copy()


def _needs_decomposition(program: torch.export.ExportedProgram, table: dict, registry: OnnxRegistry) -> bool:
    for node in program.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            if node.target in ASSERTION_OPS:
                continue  # removed by a later pass, nothing to decompose
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
