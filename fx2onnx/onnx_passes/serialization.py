"""The model as an `onnx.ModelProto`: onnx_ir's serializer, plus the types of the values
inside model-local functions in the graph's `value_info`.

Each function keeps its own `value_info` (IR 10), and its values are also listed in the
main graph's `value_info` under ``<function domain>::<function name>/<value name>``, as
the former `torch.onnx.dynamo_export` wrote them: tools that read types (and symbolic
shapes) from the graph alone find those of the values inside functions there.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir


def function_value_info_name(function: ir.Function, value_name: str) -> str:
    return f"{function.domain}::{function.name}/{value_name}"


def serialize_model(model: ir.Model) -> onnx.ModelProto:
    """`ir.serde.serialize_model` with the functions' value types in the graph's value_info."""
    proto = ir.serde.serialize_model(model)
    listed = {info.name for info in proto.graph.value_info}
    for function in model.functions.values():
        for node in function.all_nodes():  # the body and its sub-graphs, named per function
            for value in node.outputs:
                if value.type is None or not value.name:
                    continue
                name = function_value_info_name(function, value.name)
                if name not in listed:
                    listed.add(name)
                    proto.graph.value_info.append(ir.serde.serialize_value(value, name=name))
    return proto


__all__ = ["function_value_info_name", "serialize_model"]
