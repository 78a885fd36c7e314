"""Dequantized arguments moved into the functions that read them.

A model quantized in PyTorch (PT2E) dequantizes its weights and activations next to the
quantize nodes, which are outside the modules, so with module functions a quantized
linear layer's function receives float tensors: ``MatMul(x, Transpose(W))`` in the body,
``DequantizeLinear`` in the caller. The passes that give onnxruntime its integer forms
(`quantized_matmul`, `weight_layout`) look for the two together. So a parameter that
every call gives the output of a ``DequantizeLinear`` of one form (same attributes, same
inputs given) takes that node's inputs instead, and the function dequantizes them
itself; repeated until no parameter moves, so nested calls pass the integers down to the
body that computes with them. The computation is the same; a caller's
``DequantizeLinear`` stays only where something else reads its output.
"""

from __future__ import annotations

import onnx_ir as ir

from fx2onnx.onnx_passes.function_calls import FunctionCalls, fresh_value_name, set_inputs

_SUFFIXES = ("_quantized", "_scale", "_zero_point")


def _dequantize_of(call: ir.Node, index: int) -> ir.Node | None:
    argument = call.inputs[index] if index < len(call.inputs) else None
    producer = argument.producer() if argument is not None else None
    if producer is None or producer.op_type != "DequantizeLinear" or producer.domain not in ("", "ai.onnx"):
        return None
    return producer


def _form(node: ir.Node) -> tuple:
    """What must agree between the calls: attributes, which inputs are given, their types."""
    attributes = tuple(sorted((name, repr(attribute.value)) for name, attribute in node.attributes.items()))
    return attributes, tuple(None if value is None else value.dtype for value in node.inputs)


def _common_shape(values: list[ir.Value]) -> ir.Shape | None:
    shapes = {None if value.shape is None else tuple(value.shape) for value in values}
    return values[0].shape if len(shapes) == 1 else None


def _move_in(function: ir.Function, index: int, calls: list[ir.Node], dequantizes: list[ir.Node]) -> None:
    parameter = function.inputs[index]
    first = dequantizes[0]
    given = [position for position, value in enumerate(first.inputs) if value is not None]
    new_parameters = []
    for position in given:
        sources = [node.inputs[position] for node in dequantizes]
        assert all(source is not None for source in sources)
        name = fresh_value_name(function, f"{parameter.name}{_SUFFIXES[position]}")
        new_parameters.append(ir.Value(name=name, type=sources[0].type, shape=_common_shape(sources)))  # type: ignore[arg-type, union-attr]
    inputs: list[ir.Value | None] = [None] * len(first.inputs)
    for position, value in zip(given, new_parameters):
        inputs[position] = value
    attributes = {name: ir.Attr(name, attribute.type, attribute.value) for name, attribute in first.attributes.items()}
    inside = ir.node("DequantizeLinear", inputs, attributes, name=fresh_value_name(function, f"{parameter.name}/DequantizeLinear"))
    output = inside.outputs[0]
    output.type, output.shape = parameter.type, parameter.shape
    if len(function):
        function.insert_before(function[0], inside)
    else:
        function.append(inside)
    parameter.replace_all_uses_with(output, replace_graph_outputs=True)
    output.name = parameter.name
    function.inputs.pop(index)
    for offset, value in enumerate(new_parameters):
        function.inputs.insert(index + offset, value)
    for call, dequantize in zip(calls, dequantizes):
        old = list(call.inputs)
        set_inputs(call, old[:index] + [dequantize.inputs[position] for position in given] + old[index + 1:])
        owner = dequantize.graph
        if owner is not None and not dequantize.outputs[0].uses() and not dequantize.outputs[0].is_graph_output():
            owner.remove(dequantize, safe=True)


def _one_move(model: ir.Model) -> bool:
    calls = FunctionCalls(model)
    for key, function in calls.functions.items():
        sites = calls.calls[key]
        if not sites:
            continue
        for index, parameter in enumerate(function.inputs):
            if not parameter.uses():
                continue
            dequantizes = [_dequantize_of(call, index) for call in sites]
            if all(node is not None for node in dequantizes) and len({_form(node) for node in dequantizes}) == 1:  # type: ignore[arg-type]
                _move_in(function, index, sites, dequantizes)  # type: ignore[arg-type]
                return True
    return False


def dequantize_inside_functions(model: ir.Model) -> int:
    """Move every dequantized argument into the function that reads it (see the module
    docstring), in place; how many parameters moved."""
    moved = 0
    while _one_move(model):
        moved += 1
    return moved


__all__ = ["dequantize_inside_functions"]
