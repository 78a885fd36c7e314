"""float8 in the exported model: the opset that has the types, and PyTorch's overflow rule.

ONNX has the float8 types (`FLOAT8E4M3FN`, `FLOAT8E5M2` and their `FNUZ` forms) from
opset 19 on; a model that uses them at an older opset is refused with an error that
names the opset to export at. Casting an out-of-range value to float8 follows PyTorch:
`float8_e4m3fn` saturates to its largest value, the other three overflow (to infinity
for `float8_e5m2`, to NaN for the `fnuz` forms), which is ONNX `Cast`'s ``saturate``
set to 1 for the first and 0 for the others.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx_ir as ir

from diagnostics import DiagnosticContext, Level, rules

FLOAT8_OPSET = 19
_SATURATE = {
    ir.DataType.FLOAT8E4M3FN: 1,
    ir.DataType.FLOAT8E5M2: 0,
    ir.DataType.FLOAT8E4M3FNUZ: 0,
    ir.DataType.FLOAT8E5M2FNUZ: 0,
}


def _containers(model: ir.Model) -> Iterator[ir.Graph | ir.Function]:
    yield model.graph
    yield from model.functions.values()


def _nodes(model: ir.Model) -> Iterator[ir.Node]:
    for container in _containers(model):
        yield from ir.traversal.RecursiveGraphIterator(container)


def float8_types_used(model: ir.Model) -> list[ir.DataType]:
    """The float8 types of the model's values (graph, functions, subgraphs)."""
    found: dict[ir.DataType, None] = {}
    values = [*model.graph.inputs, *model.graph.initializers.values()]
    for node in _nodes(model):
        values.extend(node.outputs)
    for value in values:
        if value.dtype in _SATURATE:
            found[value.dtype] = None
    return list(found)


def check_float8_opset(model: ir.Model, context: DiagnosticContext) -> bool:
    """False, with an error recorded, when the model uses float8 at an opset without it."""
    used = float8_types_used(model)
    opset = model.opset_imports.get("", 0)
    if not used or opset >= FLOAT8_OPSET:
        return True
    names = ", ".join(dtype.name.lower() for dtype in used)
    context.record(
        rules.MODEL_VALIDATION,
        Level.ERROR,
        message=(
            f"The model uses float8 ({names}); ONNX has the float8 types from opset {FLOAT8_OPSET} on and this "
            f"export is at opset {opset}. Export at opset {FLOAT8_OPSET} or newer: "
            f"ExportOptions(opset_version={FLOAT8_OPSET}) (command line: --opset {FLOAT8_OPSET})."
        ),
    )
    return False


def follow_torch_float8_overflow(model: ir.Model) -> int:
    """Give every Cast to a float8 type PyTorch's overflow rule; returns how many."""
    changed = 0
    for node in _nodes(model):
        if node.domain != "" or node.op_type != "Cast":
            continue
        to = node.attributes.get("to")
        target = ir.DataType(to.as_int()) if to is not None else None
        if target in _SATURATE:
            node.attributes["saturate"] = ir.AttrInt64("saturate", _SATURATE[target])
            changed += 1
    return changed


__all__ = ["FLOAT8_OPSET", "check_float8_opset", "float8_types_used", "follow_torch_float8_overflow"]
