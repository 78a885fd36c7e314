"""Severity levels of a diagnostic and how they map to SARIF and to python logging."""

from __future__ import annotations

import enum
import logging


class Level(enum.IntEnum):
    """How serious a diagnostic is.

    The values equal the python logging levels the levels map to, so that ordering
    (``Level.NOTE < Level.WARNING``) and verbosity checks are plain integer comparisons.
    """

    NONE = logging.DEBUG
    NOTE = logging.INFO
    WARNING = logging.WARNING
    ERROR = logging.ERROR

    @property
    def sarif_level(self) -> str:
        """The SARIF ``result.level`` string: "none", "note", "warning" or "error"."""
        return self.name.lower()

    @property
    def logging_level(self) -> int:
        """The python logging level this level corresponds to."""
        return int(self.value)

    @classmethod
    def from_sarif(cls, sarif_level: str) -> Level:
        """Parse a SARIF level string (the inverse of ``sarif_level``)."""
        try:
            return cls[sarif_level.upper()]
        except KeyError:
            raise ValueError(
                f"Unknown SARIF level {sarif_level!r}; expected one of "
                f"{', '.join(level.sarif_level for level in cls)}."
            ) from None
