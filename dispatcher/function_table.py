"""A table of fx2onnx's own ONNX functions, filled by a decorator and read by the registry.

Each module of fx2onnx's functions (complex numbers, NaN-propagating reductions,
symbolic sizes) keeps one table in a domain of its own; the registry turns every
``(names, function)`` entry into default registrations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from onnxscript import values as osv

# (ATen names the function implements, the traced ONNX function)
TableEntry = tuple[tuple[str, ...], osv.TracedOnnxFunction]


class FunctionTable:
    """The traced ONNX functions of one domain, in the order they were defined."""

    def __init__(self, domain: str, version: int = 1) -> None:
        self.opset = osv.Opset(domain, version)
        self.entries: list[TableEntry] = []

    def op(self, *names: str) -> Callable[[Callable[..., Any]], osv.TracedOnnxFunction]:
        """Decorator: trace the Python function as the ONNX implementation of ``names``."""

        def wrap(function: Callable[..., Any]) -> osv.TracedOnnxFunction:
            traced = osv.TracedOnnxFunction(self.opset, function)
            self.entries.append((names, traced))
            return traced

        return wrap
