"""A markdown log with nested sections, gated by python logging levels."""

from __future__ import annotations

import contextlib
import logging
import re
import traceback
from collections.abc import Callable, Iterator

# A log text: a string, or a zero-argument callable producing one (evaluated lazily).
LazyText = str | Callable[[], str]


class MarkdownLog:
    """Collects markdown blocks; a block is kept only if its level reaches the verbosity.

    Sections nest ("## Title", then "### Sub"). A section that is not kept drops what is
    logged inside it too, so a DEBUG section never leaks its content at INFO verbosity.
    """

    def __init__(self, verbosity_level: int = logging.INFO) -> None:
        self.verbosity_level = verbosity_level
        self._blocks: list[str] = []
        self._sections: list[bool] = []  # kept-or-not of each open section

    def is_kept(self, level: int) -> bool:
        """Whether an entry logged now at python logging ``level`` would be kept."""
        return level >= self.verbosity_level and all(self._sections)

    def log(self, text: LazyText, level: int = logging.DEBUG) -> None:
        if self.is_kept(level):
            self._blocks.append(_evaluate(text))

    def log_code(self, text: LazyText, language: str = "", level: int = logging.DEBUG) -> None:
        if self.is_kept(level):
            self._blocks.append(fenced(_evaluate(text), language))

    @contextlib.contextmanager
    def section(self, title: LazyText, level: int = logging.DEBUG) -> Iterator[None]:
        kept = self.is_kept(level)
        if kept:
            self._blocks.append(self._heading(_evaluate(title)))
        self._sections.append(kept)
        try:
            yield
        finally:
            self._sections.pop()

    def log_exception(self, exc: BaseException, title: str = "Exception log") -> None:
        """Add the formatted traceback of ``exc``, whatever the verbosity or section."""
        formatted = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self._blocks.append(self._heading(title))
        self._blocks.append(fenced(formatted.rstrip("\n"), "pytb"))

    def markdown(self) -> str:
        return "\n\n".join(self._blocks)

    def __bool__(self) -> bool:
        return bool(self._blocks)

    def _heading(self, title: str) -> str:
        # "#" is left for the document title; top-level sections are "##".
        return "#" * (len(self._sections) + 2) + " " + title


def fenced(text: str, language: str = "") -> str:
    """``text`` in a fenced code block whose fence no backtick run in ``text`` can close."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language}\n{text}\n{fence}"


def _evaluate(text: LazyText) -> str:
    return text() if callable(text) else str(text)
