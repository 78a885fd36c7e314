"""Decompose only the operators that no registered ONNX function covers.

An operator stays whole when the registry has a function for its exact overload
(`aten.linear`, `aten.layer_norm`, `aten.scaled_dot_product_attention`...). A node on
complex tensors needs a complex implementation; when only a real one exists, PyTorch's
decomposition of the operator is used instead (e.g. complex `reshape` becomes `view`,
which has one).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._decomp import decomposition_table as _torch_decompositions

from dispatcher import OnnxRegistry, walk_graph_modules
from fx2onnx.private_ops import assertion_ops

# Building torch.export's table costs ~0.6 s; it depends only on which operators the
# registry covers, so it is kept per set of registered names.
_TABLES: dict[frozenset[str], dict] = {}
# Decompositions may expose further complex operators without a complex implementation.
_MAX_COMPLEX_ROUNDS = 3


def _has_exact_function(registry: OnnxRegistry, op: torch._ops.OpOverload) -> bool:
    """An ONNX function registered for this very overload. A function registered for the
    default overload does not cover e.g. `aten::min.other`, which PyTorch decomposes."""
    namespace, _, rest = op.name().partition("::")
    name, _, overload = rest.partition(".")
    return registry.is_registered_op(namespace, name, overload or "default")


def _has_complex_function(registry: OnnxRegistry, op: torch._ops.OpOverload) -> bool:
    for name in registry.candidate_names(op):
        if any(function.is_complex for function in registry.get_functions(name) or ()):
            return True
    return False


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


_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd


def _decomposition_of(op: torch._ops.OpOverload) -> Callable | None:
    """PyTorch's decomposition of an operator: its composite kernel, or a registered one."""
    if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
        python_kernel = op.py_kernels.get(_COMPOSITE)
        if callable(python_kernel):  # a Python decomposition (a DispatchKey entry is not callable)
            return python_kernel
        return functools.partial(_run_composite_kernel, op)
    return _torch_decompositions.get(op)


def _run_composite_kernel(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    # Not `op.decompose`: run_decompositions installs table entries as the Python kernel of
    # this very key, so decompose would call this entry again and recurse forever.
    return op._op_dk(_COMPOSITE, *args, **kwargs)


def _is_complex_node(node: torch.fx.Node) -> bool:
    return any(
        isinstance(arg.meta.get("val"), torch.Tensor) and arg.meta["val"].is_complex()
        for arg in node.all_input_nodes
    )


def _complex_gaps(program: torch.export.ExportedProgram, registry: OnnxRegistry) -> dict:
    """Decompositions for complex nodes whose operator has only real implementations."""
    gaps = {}
    for _, node in walk_graph_modules(program.graph_module):  # control-flow bodies too
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if node.target in gaps or not _is_complex_node(node) or _has_complex_function(registry, node.target):
            continue
        decomposition = _decomposition_of(node.target)
        if decomposition is not None:
            gaps[node.target] = decomposition
    return gaps


def _needs_decomposition(program: torch.export.ExportedProgram, table: dict, registry: OnnxRegistry) -> bool:
    for _, node in walk_graph_modules(program.graph_module):  # control-flow bodies too
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            if node.target in assertion_ops():
                continue  # removed by a later pass, nothing to decompose
            if node.target in table or not registry.is_supported(node.target):
                return True
    return False


def decompose_unsupported(program: torch.export.ExportedProgram, registry: OnnxRegistry) -> torch.export.ExportedProgram:
    """Run decompositions only when some operator needs one; otherwise keep the program
    as it is (no re-trace of the whole graph)."""
    table = onnx_decomposition_table(registry)
    if _needs_decomposition(program, table, registry):
        program = program.run_decompositions(table)
    for _ in range(_MAX_COMPLEX_ROUNDS):
        gaps = _complex_gaps(program, registry)
        if not gaps:
            break
        table.update(gaps)
        program = program.run_decompositions(table)
    return program
