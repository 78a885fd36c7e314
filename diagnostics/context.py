"""``DiagnosticContext``: collects the diagnostics of one export and writes the report."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from diagnostics import files, sarif, summary
from diagnostics.diagnostic import Diagnostic, exception_summary
from diagnostics.levels import Level
from diagnostics.locations import Location, Stack
from diagnostics.markdown_log import MarkdownLog
from diagnostics.options import DiagnosticOptions
from diagnostics.rule import Rule

# Recorded diagnostics are also sent to python logging, silent unless the app configures it.
logger = logging.getLogger("diagnostics")
logger.addHandler(logging.NullHandler())

_PROMOTED_SUFFIX = " (This warning was promoted to an error because warnings_as_errors is set.)"


class DiagnosticContext:
    """Collects the diagnostics of one run of a tool (one export) in order.

    >>> from diagnostics import rules
    >>> ctx = DiagnosticContext("fx2onnx", "0.1.0")
    >>> d = ctx.record(rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION, target="aten::foo")
    >>> ctx.has_errors(), d.message
    (True, 'No ONNX function to convert the call_function node aten::foo to ONNX.')
    """

    def __init__(
        self,
        tool_name: str,
        tool_version: str,
        options: DiagnosticOptions | None = None,
        *,
        information_uri: str | None = None,
    ) -> None:
        self.tool_name = tool_name
        self.tool_version = tool_version
        self.options = options if options is not None else DiagnosticOptions()
        self.information_uri = information_uri
        self._diagnostics: list[Diagnostic] = []
        self._recorded: set[int] = set()
        # the recorded diagnostics above level none, kept as they are recorded or raised
        self._reported: set[int] = set()

    @property
    def diagnostics(self) -> list[Diagnostic]:
        """The recorded diagnostics, in the order they were recorded (a copy)."""
        return list(self._diagnostics)

    @property
    def count(self) -> int:
        """How many diagnostics are recorded so far."""
        return len(self._diagnostics)

    @property
    def reported_count(self) -> int:
        """How many diagnostics a repeated piece of work must report again: at verbosity
        DEBUG (a record per node asked for) every one; otherwise those above level none
        (the level-none records of decisions are the same for every repetition)."""
        if self.would_record(Level.NONE):
            return len(self._diagnostics)
        return len(self._reported)

    def would_record(self, level: Level) -> bool:
        """Whether a diagnostic at ``level`` would be recorded (skip costly messages if not)."""
        return level >= Level.WARNING or Level(level).logging_level >= self.options.verbosity_level

    def record(
        self,
        rule: Rule,
        level: Level | None = None,
        message: str | None = None,
        *,
        location: Location | None = None,
        stack: Stack | None = None,
        properties: dict[str, Any] | None = None,
        **format_args: Any,
    ) -> Diagnostic:
        """Create a diagnostic for ``rule`` and record it if the verbosity allows.

        ``level`` defaults to the rule's default level, ``message`` to the rule's
        template filled with ``format_args``. The diagnostic is returned even when not
        recorded, so callers can log into it unconditionally; raising its level later
        records it then.
        """
        diagnostic = Diagnostic(
            rule=rule,
            level=rule.default_level if level is None else Level(level),
            message=rule.format_message(**format_args) if message is None else message,
            location=location,
            stack=stack,
            properties=dict(properties or {}),
            _log=MarkdownLog(self.options.verbosity_level),
        )
        self._admit(diagnostic)
        diagnostic._on_level_change = self._admit
        return diagnostic

    @contextlib.contextmanager
    def scope(
        self,
        rule: Rule,
        level: Level | None = None,
        message: str | None = None,
        *,
        location: Location | None = None,
        stack: Stack | None = None,
        properties: dict[str, Any] | None = None,
        **format_args: Any,
    ) -> Iterator[Diagnostic]:
        """Record a diagnostic for a unit of work; an exception inside makes it an error.

        The message then ends with the exception's type and first line, its traceback
        goes into the diagnostic's log, and the exception propagates unchanged.
        """
        diagnostic = self.record(
            rule, level, message, location=location, stack=stack,
            properties=properties, **format_args,
        )
        try:
            yield diagnostic
        except Exception as exc:
            diagnostic.message = f"{diagnostic.message} Failed: {exception_summary(exc)}"
            diagnostic.log_source_exception(exc)
            diagnostic.level = Level.ERROR
            raise

    def errors(self) -> list[Diagnostic]:
        return [d for d in self._diagnostics if d.level >= Level.ERROR]

    def warnings(self) -> list[Diagnostic]:
        return [d for d in self._diagnostics if d.level == Level.WARNING]

    def has_errors(self) -> bool:
        return any(d.level >= Level.ERROR for d in self._diagnostics)

    def sarif_log(self) -> dict[str, Any]:
        """The recorded diagnostics as a SARIF 2.1.0 log (a JSON-ready dict)."""
        return sarif.sarif_log(
            self.tool_name, self.tool_version, self._diagnostics, self.information_uri
        )

    def to_json(self, indent: int | None = 2) -> str:
        return sarif.to_json(self.sarif_log(), indent)

    def dump(self, path: str | os.PathLike[str], compress: bool = False) -> None:
        """Write the SARIF report to ``path`` (``.sarif``, or ``.sarif.gz`` when compressed)."""
        target = files.check_report_path(path, compress)
        files.write_atomically(target, self.to_json(), compress)

    def summary_text(self) -> str:
        """Errors and warnings, one per line with their source line, plus what to do."""
        return summary.summary_text(self._diagnostics)

    def _admit(self, diagnostic: Diagnostic) -> None:
        """Apply warnings_as_errors and record ``diagnostic`` once its level allows."""
        if self.options.warnings_as_errors and diagnostic.level == Level.WARNING:
            # object.__setattr__: do not re-enter this hook.
            object.__setattr__(diagnostic, "level", Level.ERROR)
            diagnostic.message += _PROMOTED_SUFFIX
            diagnostic.properties["promotedFromWarning"] = True
        if id(diagnostic) in self._recorded:
            if diagnostic.level > Level.NONE:
                self._reported.add(id(diagnostic))
            return
        if not (self.would_record(diagnostic.level) or diagnostic.rule.recorded_at_every_verbosity):
            return
        self._recorded.add(id(diagnostic))
        if diagnostic.level > Level.NONE:
            self._reported.add(id(diagnostic))
        self._diagnostics.append(diagnostic)
        logger.log(
            diagnostic.level.logging_level, "[%s] %s", diagnostic.rule.id, diagnostic.message
        )

