"""``Diagnostic``: one reported fact or problem, with its markdown log."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from diagnostics.levels import Level
from diagnostics.locations import Location, Stack
from diagnostics.markdown_log import LazyText, MarkdownLog
from diagnostics.rule import Rule


@dataclasses.dataclass(eq=False)
class Diagnostic:
    """One result of the export: a rule, a level, a message and where it happened.

    Its markdown log (``log``, ``log_section``, ``log_source_exception``) holds the
    details; entries below the context's verbosity are dropped. Setting ``level`` on a
    diagnostic created by a ``DiagnosticContext`` lets the context record it if it was
    dropped before (e.g. a node translation that turns into an error).
    """

    rule: Rule
    level: Level
    message: str
    location: Location | None = None
    stack: Stack | None = None
    properties: dict[str, Any] = dataclasses.field(default_factory=dict)
    source_exception: BaseException | None = dataclasses.field(default=None, repr=False)
    _log: MarkdownLog = dataclasses.field(default_factory=MarkdownLog, repr=False)
    # Set by the owning context: called after every change of ``level``.
    _on_level_change: Callable[[Diagnostic], None] | None = dataclasses.field(
        default=None, repr=False
    )

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "level":
            hook = getattr(self, "_on_level_change", None)
            if hook is not None:
                hook(self)

    def log(self, text: LazyText, level: int = logging.DEBUG) -> None:
        """Append ``text`` (markdown, or a zero-arg callable giving it) at logging ``level``."""
        self._log.log(text, level)

    def log_code(self, text: LazyText, language: str = "", level: int = logging.DEBUG) -> None:
        """Append ``text`` as a fenced code block (graphs, tables, source)."""
        self._log.log_code(text, language, level)

    def log_section(self, title: LazyText, level: int = logging.DEBUG) -> contextlib.AbstractContextManager[None]:
        """A markdown section: ``with diag.log_section("Inputs", logging.INFO): ...``."""
        return self._log.section(title, level)

    def log_source_exception(self, exc: BaseException) -> None:
        """Keep ``exc`` and add its formatted traceback to the log (always kept)."""
        self.source_exception = exc
        self._log.log_exception(exc)

    def would_log(self, level: int) -> bool:
        """Whether ``log(..., level)`` would keep its text now (to skip costly work)."""
        return self._log.is_kept(level)

    def markdown(self) -> str:
        """The log as markdown ("" when nothing was kept)."""
        return self._log.markdown()

    @property
    def is_error(self) -> bool:
        return self.level >= Level.ERROR


def exception_summary(exc: BaseException) -> str:
    """`Type: first line of the message`: an exception in one line, for messages."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else '(no message)'}"
