"""A table of fx2onnx's own ONNX functions, filled by a decorator and read by the registry.

Each module of fx2onnx's functions (complex numbers, NaN-propagating reductions,
symbolic sizes, special functions...) keeps one table in a domain of its own; the
registry turns every ``(names, make_function)`` entry into default registrations.

The traced ONNX function is made on first use: making one inspects the Python
function's signature and annotations, which for every function of every table would
add a tenth of a second to each process's first export, for operators most models never
reach.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from onnxscript import values as osv

# (ATen names the function implements, a maker of the traced ONNX function: made once)
TableEntry = tuple[tuple[str, ...], Callable[[], osv.TracedOnnxFunction]]


class FunctionTable:
    """The ONNX functions of one domain, in the order they were defined."""

    def __init__(self, domain: str, version: int = 1) -> None:
        self.opset = osv.Opset(domain, version)
        self.entries: list[TableEntry] = []

    def op(self, *names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: register the Python function as the ONNX implementation of ``names``
        (traced into ONNX when first used); returns the function unchanged, so other
        functions of the table may call it (its ops are then traced inline)."""

        def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
            make = functools.cache(lambda: osv.TracedOnnxFunction(self.opset, function))
            self.entries.append((names, make))
            return function

        return wrap
