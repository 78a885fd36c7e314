"""Weights held as tensor subclasses (torchao's quantized tensors) made plain tensors.

Written for torchao (the library whose quantized weights are tested) and valid for any
subclass whose operations torch.export can trace.

torch.export keeps a parameter that is a tensor subclass as it is and reads its inner
tensors with ``export::access_subclass_inner_tensor``, an operator no ONNX function can
stand for. Re-tracing the program without decompositions (`run_decompositions({})`, a
public API) splits each such parameter into its inner tensors and the subclass's own
operations into the operators it is made of (torchao's ``dequantize_affine`` among them);
only programs that hold a subclass pay for it.
"""

from __future__ import annotations

import torch

from fx2onnx.private_ops import subclass_inner_tensor_op


def subclass_weight_types(program: torch.export.ExportedProgram) -> list[str]:
    """The qualified names of the tensor subclasses among the program's weights."""
    plain = (torch.Tensor, torch.nn.Parameter)
    kinds = {type(tensor) for tensor in [*program.state_dict.values(), *program.constants.values()]}
    return sorted(f"{kind.__module__}.{kind.__qualname__}" for kind in kinds if isinstance(kind, type) and kind not in plain
                  and issubclass(kind, torch.Tensor))


def _reads_subclass_inner_tensors(program: torch.export.ExportedProgram) -> bool:
    target = subclass_inner_tensor_op()
    return target is not None and any(node.target is target for node in program.graph.nodes)


class TensorSubclassError(TypeError):
    """A weight is a tensor subclass that the program cannot be made plain of."""


def without_tensor_subclasses(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` with every tensor-subclass weight split into plain tensors (a new
    program; ``program`` itself is not changed). A subclass that stays is an error naming
    it."""
    if not _reads_subclass_inner_tensors(program):
        return program
    kinds = ", ".join(subclass_weight_types(program)) or "a tensor subclass"
    try:
        plain = program.run_decompositions({})
    except Exception as error:  # noqa: BLE001 - any failure of the re-trace is this one problem
        raise TensorSubclassError(_advice(kinds, f"re-tracing it without the subclass failed: {error}")) from error
    if _reads_subclass_inner_tensors(plain):
        raise TensorSubclassError(_advice(kinds, "its inner tensors are still read as a subclass's after re-tracing"))
    return plain


def _advice(kinds: str, what: str) -> str:
    return (
        f"The model's weights include tensor subclasses ({kinds}), and {what}. fx2onnx exports a subclass "
        "whose operations torch.export can trace as plain tensor operations (torchao's quantize_ configurations "
        "do). Dequantize these weights before exporting, or use a configuration whose tensors torch.export traces."
    )
