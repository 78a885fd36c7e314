"""Which input types ONNX Runtime's CPU kernels implement, per op and opset.

Type legalization picks, among the types an op's schema accepts, one the CPU runtime
can also run (ONNX accepts `Conv` in double, ONNX Runtime's CPU provider only in float).
The kernel table comes from onnxruntime's pybind module, the one place this private
API is reached (tests/unit/onnx_passes/test_validity.py fails loudly when it moves). Without
onnxruntime nothing is preferred and the schema alone decides.
"""

from __future__ import annotations

import functools
from typing import Any

_PROVIDER = "CPUExecutionProvider"


def _onnxruntime_state() -> Any:
    """onnxruntime's pybind module (private), or None without onnxruntime."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state
    except ImportError:
        return None
    return onnxruntime_pybind11_state


@functools.cache
def _kernel_table() -> dict[tuple[str, str], list[tuple[int, int, dict[str, list[str]]]]]:
    ort_state = _onnxruntime_state()
    if ort_state is None:
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


@functools.cache
def _runtime_schemas() -> dict[tuple[str, str], object]:
    """onnxruntime's own operator schemas (its ``com.microsoft`` kernels), newest first."""
    ort_state = _onnxruntime_state()
    if ort_state is None:
        return {}
    schemas: dict[tuple[str, str], object] = {}
    for schema in sorted(ort_state.get_all_operator_schema(), key=lambda s: s.since_version, reverse=True):
        domain = "" if schema.domain in ("", "ai.onnx") else schema.domain
        schemas.setdefault((domain, schema.name), schema)
    return schemas


def runtime_output_type(op_type: str, domain: str, output: int, input_types: list[str | None]) -> str | None:
    """The type string (``tensor(float)``) of output ``output`` of onnxruntime's operator
    ``op_type``, from its schema: the type its type parameter takes from an input of that
    parameter whose type is known (``input_types``, by position), or the one type the
    parameter allows; None when the schema does not say (no onnxruntime, no such
    operator, a variadic output)."""
    schema = _runtime_schemas().get((domain, op_type))
    if schema is None or output >= len(schema.outputs):
        return None
    parameter = schema.outputs[output].typeStr
    for formal, given in zip(schema.inputs, input_types):
        if formal.typeStr == parameter and given is not None:
            return given
    allowed = next((c.allowed_type_strs for c in schema.type_constraints if c.type_param_str == parameter), None)
    if allowed is None and parameter.startswith("tensor("):
        return parameter  # the output's type written out rather than a parameter
    return allowed[0] if allowed is not None and len(allowed) == 1 else None
