"""Warnings recorded during an export reach the user as Python warnings.

A SARIF report is complete but nobody reads it after a successful export. Each kind of
warning (one rule) becomes one Python warning of category :class:`ExportWarning` with its
count, its first occurrence and the user's source line, and a one-line summary of all
kinds goes to the ``fx2onnx`` logger and into the export's summary diagnostic.
"""

from __future__ import annotations

import logging
import warnings

from diagnostics import DiagnosticContext
from diagnostics.summary import kind_text, warning_kinds, warnings_line

logger = logging.getLogger("fx2onnx")


class ExportWarning(UserWarning):
    """A warning diagnostic of an export (filter with ``warnings.filterwarnings``)."""


def emit_export_warnings(context: DiagnosticContext, stacklevel: int = 4) -> str:
    """Emit one Python warning per warning kind recorded in ``context``; return the
    one-line summary (``"No warnings."`` when there are none)."""
    kinds = warning_kinds(context.diagnostics)
    for rule, group in kinds:
        warnings.warn(kind_text(rule, group), ExportWarning, stacklevel=stacklevel)
    line = warnings_line(context.diagnostics)
    if kinds:
        logger.warning("fx2onnx export: %s", line)
    return line
