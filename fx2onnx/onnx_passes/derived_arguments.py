"""Tensors derived from a weight, given to the module function that reads the weight.

In a module function a linear layer's weight is a parameter. The tensors a pass computes
from it when the model is written (`derived_weights`: quantized codes and scales) are
initializers of the main graph, derived from the initializer each call gives, and reach
the body as new parameters: added to every function on the way (nested calls) and given
by each of their calls. A function shared by several callers thus reads the codes of
each caller's own weight. A parameter nothing reads any more leaves its function and
its calls, and an initializer nothing reads leaves the graph, so that the float weight
is not written beside its codes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx_ir as ir

from fx2onnx.onnx_passes.derived_weights import Derive, fresh_name, register_derived
from fx2onnx.onnx_passes.function_calls import FunctionCalls, fresh_value_name, set_inputs

# an initializer and the names of the tensors derived from it -> how to compute them, and
# their (name, dtype, shape)
MakeDerived = Callable[[ir.Value, list[str]], tuple[Derive, list[tuple[str, ir.DataType, tuple[int, ...]]]]]


class DerivedArguments:
    """The derived tensors of weights, as values of the graph or function that reads them."""

    def __init__(self, model: ir.Model, calls: FunctionCalls) -> None:
        self.model = model
        self.calls = calls
        self._made: dict[tuple[int, tuple[str, ...]], list[ir.Value]] = {}

    def derived(self, weight: ir.Value, suffixes: Sequence[str], make: MakeDerived) -> list[ir.Value]:
        """The tensors derived from ``weight`` (an initializer, or a parameter every call
        gives one), one per suffix, as values where ``weight`` is read."""
        key = (id(weight), tuple(suffixes))
        if key not in self._made:
            self._made[key] = self._derive(weight, suffixes, make)
        return self._made[key]

    def _derive(self, weight: ir.Value, suffixes: Sequence[str], make: MakeDerived) -> list[ir.Value]:
        assert weight.name is not None
        if weight.is_initializer():
            graph = self.model.graph
            names = [fresh_name(graph, weight.name + suffix) for suffix in suffixes]
            derive, specs = make(weight, names)
            return register_derived(graph, weight, derive, specs)
        owner = self.calls.owner(weight)
        assert owner is not None, f"{weight.name!r} is neither an initializer nor a function parameter"
        function = self.calls.functions[owner]
        index = list(function.inputs).index(weight)
        parameters: list[ir.Value] = []
        for call in self.calls.calls[owner]:
            argument = call.inputs[index]
            assert argument is not None
            given = self.derived(argument, suffixes, make)
            if not parameters:
                parameters = [
                    ir.Value(name=fresh_value_name(function, weight.name + suffix), type=value.type, shape=value.shape)
                    for suffix, value in zip(suffixes, given)
                ]
                width = len(function.inputs)
                function.inputs.extend(parameters)
            padded = [*call.inputs, *[None] * (width - len(call.inputs))]
            set_inputs(call, [*padded[:width], *given])
        return parameters

    def drop_if_unread(self, value: ir.Value | None) -> None:
        """Remove ``value`` when nothing reads it: an initializer from the graph, a
        parameter from its function and its calls (and then what those calls gave)."""
        if value is None or value.uses() or value.is_graph_output():
            return
        if value.is_initializer():
            assert value.name is not None
            self.model.graph.initializers.pop(value.name, None)
            return
        owner = self.calls.owner(value)
        if owner is None:
            return
        function = self.calls.functions[owner]
        index = list(function.inputs).index(value)
        function.inputs.pop(index)
        for call in self.calls.calls[owner]:
            inputs = list(call.inputs)
            given = inputs.pop(index) if index < len(inputs) else None
            set_inputs(call, inputs)
            self.drop_if_unread(given)


__all__ = ["DerivedArguments", "MakeDerived"]
