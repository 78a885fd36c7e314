"""The slots of a graph's flat inputs and outputs, as translation lays them out and the
program's I/O adapters read them: which leaf feeds which ONNX input or comes from which
ONNX output, and which outputs carry the new values of mutated inputs and buffers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class InputSlot:
    """One leaf of the flattened inputs: fed to ONNX, or a value baked into the graph."""

    name: str
    is_onnx_input: bool
    constant: Any = None


@dataclass(frozen=True)
class OutputSlot:
    """One leaf of the model's outputs: an ONNX output index, or a constant."""

    onnx_index: int | None
    is_complex: bool = False
    constant: Any = None
    # int/float/bool for outputs that are symbolic sizes in PyTorch (a 0-d tensor in ONNX)
    python_type: type | None = None


@dataclass(frozen=True)
class MutationOutput:
    """A graph output that carries the new value of a mutated user input or buffer.

    ``kind`` is "user_input" or "buffer"; ``target`` the input's name or the buffer's
    attribute path (``bn.running_mean``). The ONNX output is named ``<target>.mutated``:
    ONNX needs it distinct from the input or initializer of the same name.
    """

    kind: str
    target: str
    onnx_name: str
    onnx_index: int


MUTATION_SUFFIX = ".mutated"
