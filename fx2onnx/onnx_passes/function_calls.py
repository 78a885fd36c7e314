"""Which values reach each model-local function's parameters, for the passes that look
through calls.

With module functions a weight reaches the node that reads it as a parameter, perhaps
through several nested calls, and a pass that needs a stored tensor (a weight, a scale, a
zero point) must see the initializer behind it. One function body serves all its
callers, so a parameter counts as stored only when every call gives it a stored value.
The index is a snapshot: a pass that adds or removes calls builds a new one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx_ir as ir

from fx2onnx.onnx_passes.model_graphs import model_nodes


def is_stored(value: ir.Value | None) -> bool:
    """A tensor known when the model is loaded: an initializer or a constant's output."""
    if value is None:
        return False
    if value.is_initializer() or value.const_value is not None:
        return True
    producer = value.producer()
    return producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx")


def fresh_value_name(function: ir.Function, wanted: str) -> str:
    """``wanted``, or it with a count appended when a parameter or a value of
    ``function``'s body has that name (for a new parameter or node output)."""
    taken = {value.name for value in function.inputs} | {
        value.name for node in function.all_nodes() for value in node.outputs
    }
    name, count = wanted, 1
    while name in taken:
        name, count = f"{wanted}_{count}", count + 1
    return name


def set_inputs(node: ir.Node, inputs: Sequence[ir.Value | None]) -> None:
    """Make ``inputs`` the inputs of ``node`` (a call given more or fewer arguments)."""
    node.resize_inputs(max(len(node.inputs), len(inputs)))
    for index, value in enumerate(inputs):
        node.replace_input_with(index, value)
    node.resize_inputs(len(inputs))


class FunctionCalls:
    """The calls of every model-local function and the arguments of its parameters."""

    def __init__(self, model: ir.Model) -> None:
        self.functions: dict[ir.OperatorIdentifier, ir.Function] = dict(model.functions)
        self.calls: dict[ir.OperatorIdentifier, list[ir.Node]] = {key: [] for key in self.functions}
        for node in model_nodes(model):
            key = node.op_identifier()
            if key in self.functions:
                self.calls[key].append(node)
        # id(output) -> where functions return it: (function key, position)
        self._returned: dict[int, list[tuple[ir.OperatorIdentifier, int]]] = {}
        for key, function in self.functions.items():
            for position, output in enumerate(function.outputs):
                self._returned.setdefault(id(output), []).append((key, position))
        # id(parameter) -> (function key, index)
        self._places = {
            id(parameter): (key, index)
            for key, function in self.functions.items()
            for index, parameter in enumerate(function.inputs)
        }

    def called(self, node: ir.Node) -> ir.Function | None:
        """The function ``node`` calls, if it calls one of the model's."""
        return self.functions.get(node.op_identifier())

    def arguments(self, parameter: ir.Value) -> list[ir.Value | None] | None:
        """What each call gives ``parameter`` (None where a call leaves it out); None
        when ``parameter`` is no function's parameter."""
        key = self.owner(parameter)
        if key is None:
            return None
        index = list(self.functions[key].inputs).index(parameter)  # parameters may have moved
        return [call.inputs[index] if index < len(call.inputs) else None for call in self.calls[key]]

    def final_uses(self, value: ir.Value) -> list[tuple[ir.Node, int]]:
        """The uses of ``value`` as the runtime sees them once calls are inlined: a use by
        a call of a model-local function stands for the uses of the parameter it binds,
        and a function's output for the uses of that output at every call (at any depth)."""
        found: list[tuple[ir.Node, int]] = []
        pending, seen = [value], set()
        while pending:
            current = pending.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            for node, index in current.uses():
                called = self.called(node)
                if called is not None and index < len(called.inputs):
                    pending.append(called.inputs[index])
                else:
                    found.append((node, index))
            for key, position in self._returned.get(id(current), ()):
                pending.extend(call.outputs[position] for call in self.calls[key] if position < len(call.outputs))
        return found

    def owner(self, parameter: ir.Value) -> ir.OperatorIdentifier | None:
        """The key of the function ``parameter`` belongs to (None: no parameter)."""
        place = self._places.get(id(parameter))
        return None if place is None else place[0]

    def is_stored(self, value: ir.Value | None) -> bool:
        """``value`` is stored, or a parameter every call gives a stored value (at any
        depth of nested calls); a function nobody calls has no stored parameter."""
        return self._behind(value, is_stored, frozenset())

    def is_initializer_behind(self, value: ir.Value | None) -> bool:
        """``value`` is an initializer, or a parameter every call gives one (at any depth)."""
        return self._behind(value, lambda v: v is not None and v.is_initializer(), frozenset())

    def _behind(self, value: ir.Value | None, found: Callable[[ir.Value | None], bool], seen: frozenset[int]) -> bool:
        if found(value):
            return True
        if value is None or id(value) in seen:
            return False
        arguments = self.arguments(value)
        seen = seen | {id(value)}
        return bool(arguments) and all(self._behind(argument, found, seen) for argument in arguments)  # type: ignore[arg-type]


__all__ = ["FunctionCalls", "fresh_value_name", "is_stored", "set_inputs"]
