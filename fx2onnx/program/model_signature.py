"""`ONNXProgram.model_signature`: torch.export's graph signature in ONNX names.

Which ONNX inputs are user inputs and which initializers are parameters, buffers or
constants; which ONNX outputs are user outputs and which carry mutated buffers or inputs.
Tooling maps names both ways with it (`onnx_name_of`, `torch_name_of`), and
`ONNXProgram.save(model_state=...)` checks a state dict's names against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx_ir as ir
import torch

from fx2onnx.onnx_passes.weight_layout import is_stored_transposed
from fx2onnx.translate.io_slots import InputSlot, MutationOutput

# Kinds, named as torch.export's InputKind / OutputKind in lower case.
USER_INPUT = "user_input"
PARAMETER = "parameter"
BUFFER = "buffer"
CONSTANT_TENSOR = "constant_tensor"
USER_OUTPUT = "user_output"
BUFFER_MUTATION = "buffer_mutation"
USER_INPUT_MUTATION = "user_input_mutation"
_WEIGHT_KINDS = (PARAMETER, BUFFER, CONSTANT_TENSOR)


@dataclass(frozen=True)
class SignatureEntry:
    """One input or output of the exported program.

    Attributes:
        kind: "user_input", "parameter", "buffer", "constant_tensor" (inputs);
            "user_output", "buffer_mutation", "user_input_mutation" (outputs).
        onnx_name: its name in the ONNX graph; None when it has no ONNX counterpart (a
            weight no node reads, a Python scalar baked into the graph).
        torch_name: the parameter/buffer/constant name (`layer.0.weight`), the FX name
            of a user input, or the mutated buffer's/input's name; None for user outputs.
        persistent: for buffers, whether they are in the module's `state_dict()`.
        aliases: other names of the same tensor in the module (tied weights: a
            checkpoint holds one of them).
        stored_transposed: for a 2-D weight, whether the ONNX model holds its transpose
            (a linear layer's weight, stored as the MatMul reads it; see
            `fx2onnx.onnx_passes.weight_layout`).
    """

    kind: str
    onnx_name: str | None
    torch_name: str | None
    persistent: bool | None = None
    aliases: tuple[str, ...] = ()
    stored_transposed: bool = False


@dataclass(frozen=True)
class ModelSignature:
    """torch.export's graph signature in ONNX names (`ONNXProgram.model_signature`).

    Attributes:
        inputs: one entry per ONNX graph input and initializer, with its kind (user input,
            parameter, buffer, constant) and its name in PyTorch.
        outputs: one entry per ONNX graph output: user outputs, then the new values of
            mutated buffers and inputs.
    """

    inputs: tuple[SignatureEntry, ...]
    outputs: tuple[SignatureEntry, ...]

    def _inputs_of(self, kind: str) -> dict[str, str]:
        return {e.onnx_name: e.torch_name for e in self.inputs if e.kind == kind and e.onnx_name is not None}  # type: ignore[misc]

    @property
    def user_inputs(self) -> list[str]:
        """ONNX names of the inputs a user feeds, in order."""
        return [e.onnx_name for e in self.inputs if e.kind == USER_INPUT and e.onnx_name is not None]  # type: ignore[misc]

    @property
    def parameters(self) -> dict[str, str]:
        """ONNX initializer name -> parameter name."""
        return self._inputs_of(PARAMETER)

    @property
    def buffers(self) -> dict[str, str]:
        """ONNX initializer name -> buffer name."""
        return self._inputs_of(BUFFER)

    @property
    def constants(self) -> dict[str, str]:
        """ONNX initializer name -> lifted constant tensor name."""
        return self._inputs_of(CONSTANT_TENSOR)

    @property
    def user_outputs(self) -> list[str]:
        return [e.onnx_name for e in self.outputs if e.kind == USER_OUTPUT and e.onnx_name is not None]  # type: ignore[misc]

    @property
    def mutated_buffers(self) -> dict[str, str]:
        """ONNX output name -> name of the buffer it holds the new value of."""
        return {e.onnx_name: e.torch_name for e in self.outputs if e.kind == BUFFER_MUTATION}  # type: ignore[misc]

    @property
    def mutated_inputs(self) -> dict[str, str]:
        """ONNX output name -> name of the user input it holds the new value of."""
        return {e.onnx_name: e.torch_name for e in self.outputs if e.kind == USER_INPUT_MUTATION}  # type: ignore[misc]

    def weight_names(self) -> list[str]:
        """Names of every parameter, buffer and constant tensor of the program."""
        return [e.torch_name for e in self.inputs if e.kind in _WEIGHT_KINDS and e.torch_name is not None]

    def stored_transposed(self) -> list[str]:
        """Names of the weights the ONNX model holds transposed (its MatMul's layout)."""
        return [e.torch_name for e in self.inputs if e.stored_transposed and e.torch_name is not None]

    def aliases(self) -> dict[str, tuple[str, ...]]:
        """Each tied parameter or buffer -> its other names in the module."""
        return {e.torch_name: e.aliases for e in self.inputs if e.aliases and e.torch_name is not None}

    def torch_names(self) -> dict[str, str]:
        """ONNX input or initializer name -> the torch name behind it."""
        return {e.onnx_name: e.torch_name for e in self.inputs if e.onnx_name is not None and e.torch_name is not None}

    def state_dict_names(self) -> list[str]:
        """Names `model.state_dict()` has: parameters and persistent buffers."""
        return [
            e.torch_name  # type: ignore[misc]
            for e in self.inputs
            if e.kind == PARAMETER or (e.kind == BUFFER and e.persistent is not False)
        ]

    def onnx_name_of(self, torch_name: str) -> str | None:
        """The ONNX input or initializer of a parameter, buffer, constant or user input."""
        return next((e.onnx_name for e in self.inputs if e.torch_name == torch_name), None)

    def torch_name_of(self, onnx_name: str) -> str | None:
        """The torch name behind an ONNX input, initializer or mutation output."""
        return next((e.torch_name for e in (*self.inputs, *self.outputs) if e.onnx_name == onnx_name), None)


def build_model_signature(
    program: torch.export.ExportedProgram | None,
    input_slots: Sequence[InputSlot],
    model: ir.Model,
    mutation_outputs: Sequence[MutationOutput],
    module: torch.nn.Module | None = None,
) -> ModelSignature:
    """Map the program's graph signature onto the names of the ONNX model; ``module``,
    the exported module, tells the other names of tied weights."""
    tied = _tied_names(module)
    graph = model.graph
    onnx_inputs = iter(v.name for v in graph.inputs)
    # ONNX inputs come from the user inputs fed to ONNX, in order.
    user_input_names = {slot.name: next(onnx_inputs, None) for slot in input_slots if slot.is_onnx_input}
    inputs: list[SignatureEntry] = []
    if program is not None:
        for spec in program.graph_signature.input_specs:
            kind = spec.kind.name.lower()
            name = getattr(spec.arg, "name", None)
            if kind == USER_INPUT:
                inputs.append(SignatureEntry(kind, user_input_names.get(name), name))
            elif kind in _WEIGHT_KINDS:
                onnx_name = spec.target if spec.target in graph.initializers else None
                persistent = spec.persistent if kind == BUFFER else None
                aliases = tuple(n for n in tied.get(spec.target, ()) if n != spec.target)
                transposed = onnx_name is not None and is_stored_transposed(graph.initializers[onnx_name])
                inputs.append(SignatureEntry(kind, onnx_name, spec.target, persistent, aliases, transposed))
    else:
        inputs += [SignatureEntry(USER_INPUT, onnx, fx) for fx, onnx in user_input_names.items()]
        # a GraphModule's tensor attributes (get_attr) are its constants
        inputs += [
            SignatureEntry(CONSTANT_TENSOR, name, name, stored_transposed=is_stored_transposed(value))
            for name, value in graph.initializers.items()
        ]
    by_index = {m.onnx_index: m for m in mutation_outputs}
    outputs = []
    for index, value in enumerate(graph.outputs):
        mutation = by_index.get(index)
        if mutation is None:
            outputs.append(SignatureEntry(USER_OUTPUT, value.name, None))
        else:
            kind = BUFFER_MUTATION if mutation.kind == "buffer" else USER_INPUT_MUTATION
            outputs.append(SignatureEntry(kind, value.name, mutation.target))
    return ModelSignature(tuple(inputs), tuple(outputs))


def _tied_names(module: torch.nn.Module | None) -> dict[str, tuple[str, ...]]:
    """Each parameter or buffer name -> every name of the same tensor in ``module``."""
    if not isinstance(module, torch.nn.Module):
        return {}
    groups: dict[int, list[str]] = {}
    for name, tensor in (*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)):
        groups.setdefault(id(tensor), []).append(name)
    return {name: tuple(names) for names in groups.values() if len(names) > 1 for name in names}
