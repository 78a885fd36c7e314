"""Which input types ONNX Runtime's CPU kernels implement, per op and opset.

Type legalization picks, among the types an op's schema accepts, one the CPU runtime
can also run (ONNX accepts `Conv` in double, ONNX Runtime's CPU provider only in float).
The kernel table comes from onnxruntime's pybind module, the one place this private
API is reached (tests/unit/onnx_passes/test_validity.py fails loudly when it moves). Without
onnxruntime nothing is preferred and the schema alone decides.
"""

from __future__ import annotations

import functools

_PROVIDER = "CPUExecutionProvider"


@functools.cache
def _kernel_table() -> dict[tuple[str, str], list[tuple[int, int, dict[str, list[str]]]]]:
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_state
    except ImportError:
        return {}
    table: dict[tuple[str, str], list[tuple[int, int, dict[str, list[str]]]]] = {}
    for kernel in ort_state.get_all_opkernel_def():
        if kernel.provider != _PROVIDER:
            continue
        low, high = kernel.version_range
        domain = "" if kernel.domain in ("", "ai.onnx") else kernel.domain
        table.setdefault((domain, kernel.op_name), []).append((low, high, dict(kernel.type_constraints)))
    return table


def cpu_kernel_types(op_type: str, opset: int, type_param: str, domain: str = "") -> set[str] | None:
    """Type strings (``tensor(float)``) the CPU runtime implements for ``type_param`` of
    ``op_type`` at ``opset``; None when unknown (no kernel listed, or no onnxruntime)."""
    found: set[str] = set()
    known = False
    for low, high, constraints in _kernel_table().get((domain, op_type), []):
        if low <= opset <= high and type_param in constraints:
            known = True
            found.update(constraints[type_param])
    return found if known else None
