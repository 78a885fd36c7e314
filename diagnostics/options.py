"""User-facing options that control what diagnostics are kept."""

from __future__ import annotations

import dataclasses
import logging


@dataclasses.dataclass
class DiagnosticOptions:
    """Options for one export's diagnostics.

    ``verbosity_level`` is a python logging level: diagnostics and log entries below it
    are dropped (warnings and errors are always kept). ``warnings_as_errors`` turns every
    warning into an error, which makes the export fail.
    """

    verbosity_level: int = logging.INFO
    warnings_as_errors: bool = False
