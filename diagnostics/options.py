"""User-facing options that control what diagnostics are kept."""

from __future__ import annotations

import dataclasses
import logging

from diagnostics.checked_fields import CheckedFields, at_least


@dataclasses.dataclass
class DiagnosticOptions(CheckedFields):
    """Options for one export's diagnostics.

    ``verbosity_level`` is a python logging level: diagnostics and log entries below it
    are dropped (warnings and errors are always kept). ``warnings_as_errors`` turns every
    warning into an error, which makes the export fail.
    """

    verbosity_level: int = dataclasses.field(
        default=logging.INFO, metadata=at_least(0, "a logging level (an int: logging.DEBUG, logging.INFO, ...)")
    )
    warnings_as_errors: bool = False
