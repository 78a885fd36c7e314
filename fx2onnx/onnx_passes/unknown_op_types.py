"""Outputs of operators ONNX has no schema for, typed where they leave a function body.

ONNX's checker infers a call of a model-local function from its body alone: the
``value_info`` a function keeps is not read, so the output of an operator ONNX does not
know (onnxruntime's ``com.microsoft`` kernels: ``MatMulNBits``, ``GroupQueryAttention``)
has no type, nor has anything computed from it, and once it leaves the body the first
node of the caller that reads it fails (``Input 0 expected to have type but instead is
null``). In the main graph the ``value_info`` gives that type. So in a function body
such an output goes through a ``Cast`` to its own type, whose type ONNX infers from the
attribute; onnxruntime removes a Cast to the same type when it loads the model. An
output the translation left without a type (an onnxruntime kernel inlined from a fused
rule's function) takes the one its schema in onnxruntime gives it (`cpu_kernel_types`).
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

from fx2onnx.onnx_passes.cpu_kernel_types import runtime_output_type
from fx2onnx.onnx_passes.function_calls import FunctionCalls
from fx2onnx.onnx_passes.legalize_types import string_type, type_string


def _unknown(node: ir.Node, calls: FunctionCalls) -> bool:
    if calls.called(node) is not None:
        return False
    domain = "" if node.domain == "ai.onnx" else node.domain
    return not onnx.defs.has(node.op_type, domain)


def _typed_by_schema(node: ir.Node, index: int) -> None:
    """Output ``index`` of ``node`` given the element type onnxruntime's schema gives it,
    where the translation left it without one."""
    value = node.outputs[index]
    if value.dtype is not None:
        return
    given = [type_string(v.dtype) if v is not None and v.dtype is not None else None for v in node.inputs]
    found = runtime_output_type(node.op_type, "" if node.domain == "ai.onnx" else node.domain, index, given)
    if found is not None:
        value.dtype = string_type(found)


def type_unknown_op_outputs(model: ir.Model) -> int:
    """Give every output of an operator ONNX does not know in a function body a typed
    Cast (see the module docstring), in place; how many were given one."""
    calls = FunctionCalls(model)
    typed = 0
    for function in model.functions.values():
        for node in [n for n in function if _unknown(n, calls)]:
            for index, value in enumerate(node.outputs):
                _typed_by_schema(node, index)
                if value.dtype is None or not (value.uses() or value in function.outputs):
                    continue
                cast = ir.node("Cast", [value], {"to": value.dtype}, name=f"{node.name}/typed")
                function.opset_imports.setdefault("", model.opset_imports.get("", model.graph.opset_imports.get("", 18)))
                typed_value = cast.outputs[0]
                typed_value.type, typed_value.shape = value.type, value.shape
                function.insert_after(node, cast)
                for user, index in [(u, i) for u, i in value.uses() if u is not cast]:
                    user.replace_input_with(index, typed_value)
                outputs = function.outputs
                for position, output in enumerate(outputs):
                    if output is value:
                        outputs[position] = typed_value
                if typed_value in function.outputs:  # the output keeps its name
                    name, value.name = value.name, f"{value.name}_untyped"
                    typed_value.name = name
                typed += 1
    return typed


__all__ = ["type_unknown_op_outputs"]
