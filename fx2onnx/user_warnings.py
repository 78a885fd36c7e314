"""Warnings recorded during an export reach the user as Python warnings.

A SARIF report is complete but nobody reads it after a successful export. Each kind of
warning (one rule) becomes one Python warning of category :class:`ExportWarning` with its
count, its first occurrence and the user's source line, and a one-line summary of all
kinds goes to the ``fx2onnx`` logger and into the export's summary diagnostic.
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

from diagnostics import DiagnosticContext
from diagnostics.summary import kind_text, warning_kinds, warnings_line

logger = logging.getLogger("fx2onnx")


class ExportWarning(UserWarning):
    """A warning diagnostic of an export (filter with ``warnings.filterwarnings``)."""


_PACKAGE = str(Path(__file__).resolve().parent)


def user_stacklevel() -> int:
    """The `warnings.warn` stacklevel, for its caller, of the first frame outside fx2onnx:
    a warning then points at the user's call of the exporter, however deep in the
    stages it was raised."""
    frame, level = sys._getframe(1), 1
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def emit_export_warnings(context: DiagnosticContext, stacklevel: int | None = None) -> str:
    """Emit one Python warning per warning kind recorded in ``context`` (at the user's
    call unless ``stacklevel`` says otherwise); return the one-line summary
    (``"No warnings."`` when there are none)."""
    stacklevel = stacklevel if stacklevel is not None else user_stacklevel()
    kinds = warning_kinds(context.diagnostics)
    for rule, group in kinds:
        warnings.warn(kind_text(rule, group), ExportWarning, stacklevel=stacklevel)
    line = warnings_line(context.diagnostics)
    if kinds:
        logger.warning("fx2onnx export: %s", line)
    return line
