"""Errors that fx2onnx raises to its users."""

from __future__ import annotations

from typing import Any, Protocol


class _ExportResult(Protocol):
    """What a failed export built (an `ONNXProgram`): named by its shape, so that this
    module, which every stage imports, imports none of them."""

    diagnostic_context: Any


class OnnxExporterError(RuntimeError):
    """The export failed. `onnx_program` holds what was built and its diagnostics;
    the message lists every problem found, with the user's source lines."""

    def __init__(self, onnx_program: _ExportResult, message: str) -> None:
        super().__init__(message)
        self.onnx_program = onnx_program

    @property
    def diagnostic_context(self):  # noqa: ANN201 - DiagnosticContext
        return self.onnx_program.diagnostic_context


class UnsupportedInputError(ValueError):
    """Inputs given to an ONNXProgram do not fit the inputs it was exported with."""
