"""Initializers computed from a model weight when they are written (quantized weights).

A pass that replaces a weight by tensors computed from it (MatMulNBits' codes and
scales) does not compute them at once: each new initializer holds a `DerivedTensor`,
which knows the weight it comes from (`source`, the replaced initializer's value, with
its name, layout and, unless exported in fake mode, its data) and how to compute itself
from it. The tensors are computed when the model is written, one weight at a time, from
the program's weight or from the same weight read out of a checkpoint
(`ONNXProgram.save(model_state=...)`, fake mode), so that nothing holds all the float
weights and the checkpoint's names still find the weights behind the new initializers.

The tensors derived from one weight share a `DerivedGroup`, which computes them
together and keeps them only until each was taken once. A group may also come from
several weights (`register_derived` given a list: a float layer's query, key and value
weights written side by side as one, `packed_float_projections`), read together when it
is written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir
import torch

from fx2onnx.translate.tensor_data import TorchTensorData, has_data

# the source weights as the model stores them (one for most groups) -> each derived
# initializer's tensor, by name
Derive = Callable[..., dict[str, torch.Tensor]]
# reads a group's source weights, in the stored layout, in the order of its sources
ReadSources = Callable[[], Sequence[torch.Tensor]]


class DerivedGroup:
    """The initializers computed together from one weight (or a few, read together)."""

    def __init__(self, sources: ir.Value | Sequence[ir.Value], derive: Derive, names: list[str]) -> None:
        self.sources = [sources] if isinstance(sources, ir.Value) else list(sources)
        self._derive = derive
        self._names = names
        self._cached: tuple[object, dict[str, torch.Tensor], set[str]] | None = None

    @property
    def source(self) -> ir.Value:
        """The weight the group comes from (the first, for a group of several)."""
        return self.sources[0]

    def tensor(self, name: str, key: object, read: ReadSources) -> torch.Tensor:
        """The tensor ``name`` derived from the weights ``read`` gives (``key`` says which
        reading it is: the outputs of one reading are computed once)."""
        if self._cached is None or self._cached[0] != key:
            self._cached = (key, self._derive(*read()), set())
        _, outputs, taken = self._cached
        taken.add(name)
        if taken.issuperset(self._names):
            self._cached = None  # every output taken: keep no copy
        return outputs[name]

    def program_weights(self) -> list[torch.Tensor]:
        """The source weights as the program holds them (stored layout)."""
        return [_program_weight(source) for source in self.sources]


def _program_weight(source: ir.Value) -> torch.Tensor:
    tensor = source.const_value
    if tensor is None or not has_data(tensor):
        raise ValueError(f"the weight {source.name!r} has no data: give the weights with model_state")
    if isinstance(tensor, TorchTensorData):
        return tensor.raw
    return torch.from_numpy(np.array(tensor.numpy()))  # a copy: numpy arrays of ir.Tensor may be read-only


class DerivedTensor(ir.LazyTensor):
    """An initializer's tensor computed from another weight when it is written."""

    def __init__(self, group: DerivedGroup, name: str, dtype: ir.DataType, shape: ir.Shape) -> None:
        self.group = group
        super().__init__(self._from_program, dtype, shape, name=name)

    def _from_program(self) -> ir.TensorProtocol:
        assert self.name is not None
        return TorchTensorData(self.group.tensor(self.name, "program", self.group.program_weights), name=self.name)

    @property
    def has_data(self) -> bool:
        return all(has_data(source.const_value) for source in self.group.sources)

    def from_weights(self, key: object, read: ReadSources) -> torch.Tensor:
        """This tensor computed from the source weights that ``read`` gives in the stored
        layout, in the order of the group's sources."""
        assert self.name is not None
        return self.group.tensor(self.name, key, read)


def fresh_name(graph: ir.Graph, wanted: str) -> str:
    """``wanted``, or it with a count appended when an initializer has that name."""
    name, count = wanted, 1
    while name in graph.initializers:
        name, count = f"{wanted}_{count}", count + 1
    return name


def register_derived(
    graph: ir.Graph, source: ir.Value | Sequence[ir.Value], derive: Derive,
    specs: list[tuple[str, ir.DataType, tuple[int, ...]]],
) -> list[ir.Value]:
    """New initializers of ``graph``, one per (name, dtype, shape) of ``specs``, computed
    together from the initializer ``source`` (or the initializers, given to ``derive`` in
    their order) by ``derive`` when the model is written."""
    group = DerivedGroup(source, derive, [name for name, _, _ in specs])
    values = []
    for name, dtype, shape in specs:
        tensor = DerivedTensor(group, name, dtype, ir.Shape(shape))
        value = ir.Value(name=name, shape=ir.Shape(shape), type=ir.TensorType(dtype), const_value=tensor)
        graph.register_initializer(value)
        values.append(value)
    return values


def derived_initializers(model: ir.Model) -> dict[str, DerivedTensor]:
    """The initializers of ``model`` computed from a weight when written, by name."""
    return {
        name: value.const_value
        for name, value in model.graph.initializers.items()
        if isinstance(value.const_value, DerivedTensor)
    }


def initializer_sources(model: ir.Model) -> dict[str, list[str]]:
    """By initializer of ``model``, the names of the weights it is written from: a derived
    initializer's source weights (which may have left the graph), every other one's own."""
    derived = derived_initializers(model)
    return {
        name: [source.name or name for source in derived[name].group.sources] if name in derived else [name]
        for name in model.graph.initializers
    }


def source_weight_names(model: ir.Model) -> set[str]:
    """The names of the weights ``model``'s initializers are written from (`initializer_sources`)."""
    return {source for sources in initializer_sources(model).values() for source in sources}
