"""SARIF 2.1.0 diagnostics for fx2onnx: rules, levels, a collecting context, emission.

Pure standard library: it knows nothing of torch or ONNX and can be used on its own.

>>> from diagnostics import DiagnosticContext, rules
>>> ctx = DiagnosticContext("fx2onnx", "0.1.0")
>>> _ = ctx.record(rules.CAPTURE_FAILURE, reason="data-dependent control flow")
>>> ctx.sarif_log()["runs"][0]["results"][0]["ruleId"]
'FXE0017'
"""

from diagnostics import rules
from diagnostics.context import DiagnosticContext
from diagnostics.diagnostic import Diagnostic, exception_summary
from diagnostics.files import write_atomically
from diagnostics.levels import Level
from diagnostics.locations import Location, Stack
from diagnostics.options import DiagnosticOptions
from diagnostics.rule import Rule

__all__ = [
    "Diagnostic",
    "DiagnosticContext",
    "DiagnosticOptions",
    "Level",
    "Location",
    "Rule",
    "Stack",
    "exception_summary",
    "rules",
    "write_atomically",
]
