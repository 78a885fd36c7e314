"""Errors that fx2onnx raises to its users."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fx2onnx.program.onnx_program import ONNXProgram


class OnnxExporterError(RuntimeError):
    """The export failed. `onnx_program` holds what was built and its diagnostics;
    the message lists every problem found, with the user's source lines."""

    def __init__(self, onnx_program: "ONNXProgram", message: str) -> None:
        super().__init__(message)
        self.onnx_program = onnx_program

    @property
    def diagnostic_context(self):  # noqa: ANN201 - DiagnosticContext
        return self.onnx_program.diagnostic_context


class UnsupportedInputError(ValueError):
    """Inputs given to an ONNXProgram do not fit the inputs it was exported with."""
