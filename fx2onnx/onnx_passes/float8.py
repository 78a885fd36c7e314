"""float8 in the exported model: the opset that has the types, and PyTorch's overflow rule.

ONNX has the float8 types (`FLOAT8E4M3FN`, `FLOAT8E5M2` and their `FNUZ` forms) from
opset 19 on, which the default opset (20) has; an opset chosen older than 19 is refused
with an error that names the opset to export at. Casting an out-of-range value to float8
follows PyTorch: `float8_e4m3fn` saturates to its largest value, the other three overflow (to infinity
for `float8_e5m2`, to NaN for the `fnuz` forms), which is ONNX `Cast`'s ``saturate``
set to 1 for the first and 0 for the others.
"""

from __future__ import annotations


import onnx_ir as ir

from fx2onnx.onnx_passes.model_graphs import model_nodes

from diagnostics import DiagnosticContext, Level, rules

FLOAT8_OPSET = 19
_SATURATE = {
    ir.DataType.FLOAT8E4M3FN: 1,
    ir.DataType.FLOAT8E5M2: 0,
    ir.DataType.FLOAT8E4M3FNUZ: 0,
    ir.DataType.FLOAT8E5M2FNUZ: 0,
}


def float8_types_used(model: ir.Model) -> list[ir.DataType]:
    """The float8 types of the model's values (graph, functions, subgraphs)."""
    found: dict[ir.DataType, None] = {}
    values = [*model.graph.inputs, *model.graph.initializers.values()]
    for node in model_nodes(model):
        values.extend(node.outputs)
    for value in values:
        if value.dtype in _SATURATE:
            found[value.dtype] = None
    return list(found)


def legalize_float8(model: ir.Model, context: DiagnosticContext) -> bool:
    """Give a model that uses float8 its casts PyTorch's overflow rule; below opset 19,
    which has no float8, False with an error recorded. One walk over the model when it
    has no float8."""
    used = float8_types_used(model)
    if not used:
        return True
    opset = model.opset_imports.get("", 0)
    names = ", ".join(dtype.name.lower() for dtype in used)
    if opset < FLOAT8_OPSET:
        context.record(
            rules.MODEL_VALIDATION,
            Level.ERROR,
            message=(
                f"The model uses float8 ({names}); ONNX has the float8 types from opset {FLOAT8_OPSET} on and "
                f"this export is at opset {opset}. Export at opset {FLOAT8_OPSET} or newer: "
                f"ExportOptions(opset_version={FLOAT8_OPSET}) (command line: --opset {FLOAT8_OPSET})."
            ),
        )
        return False
    follow_torch_float8_overflow(model)
    return True


def follow_torch_float8_overflow(model: ir.Model) -> int:
    """Give every Cast to a float8 type PyTorch's overflow rule; returns how many."""
    changed = 0
    for node in model_nodes(model):
        if node.domain != "" or node.op_type != "Cast":
            continue
        to = node.attributes.get("to")
        target = ir.DataType(to.as_int()) if to is not None else None
        if target in _SATURATE:
            node.attributes["saturate"] = ir.AttrInt64("saturate", _SATURATE[target])
            changed += 1
    return changed


__all__ = ["FLOAT8_OPSET", "float8_types_used", "follow_torch_float8_overflow", "legalize_float8"]
