"""Source locations and Python call stacks, parsed from traceback text or frames."""

from __future__ import annotations

import dataclasses
import linecache
import re
import traceback
from collections.abc import Iterable, Sequence


@dataclasses.dataclass(frozen=True)
class Location:
    """A place in a source file. ``line`` and ``column`` are 1-based (as SARIF counts)."""

    path: str
    line: int
    column: int | None = None
    snippet: str | None = None
    function: str | None = None

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclasses.dataclass(frozen=True)
class Stack:
    """A call stack, innermost frame LAST (the order of a Python traceback)."""

    frames: tuple[Location, ...] = ()
    message: str | None = None

    @classmethod
    def from_python_traceback(cls, text: str | None) -> Stack:
        """Parse the text of a Python traceback or of ``torch.fx.Node.stack_trace``.

        Only ``File "...", line N, in func`` lines make frames; the indented line that
        follows one becomes its snippet. Anything else (headers, caret markers, the
        exception line) is ignored, so partial or odd text still gives what it can.
        """
        return Stack(frames=tuple(_parse_frames(text or "")))

    @classmethod
    def from_frame_summaries(
        cls, summaries: Iterable[traceback.FrameSummary], message: str | None = None
    ) -> Stack:
        """Build a stack from ``traceback.extract_tb``/``extract_stack`` results."""
        return Stack(frames=tuple(_from_summary(s) for s in summaries), message=message)

    @classmethod
    def from_exception(cls, exc: BaseException) -> Stack:
        """The stack of an exception's traceback, with the exception as the message."""
        message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return cls.from_frame_summaries(traceback.extract_tb(exc.__traceback__), message)

    def innermost(self, exclude: Sequence[str] = ()) -> Location | None:
        """The innermost frame whose path contains none of ``exclude``, else None.

        Pass e.g. ("/site-packages/torch/", "/fx2onnx/") to find the user's own line.
        """
        for frame in reversed(self.frames):
            if not any(part in frame.path for part in exclude):
                return frame
        return None

    def __bool__(self) -> bool:
        return bool(self.frames)


_FRAME_LINE = re.compile(r'^\s*File "(?P<path>.+)", line (?P<line>\d+)(?:, in (?P<func>.+?))?\s*$')
# Python 3.11+ marks the failing expression under the source line with these.
_MARKER_LINE = re.compile(r"^\s*[~^\s]+$")


def _parse_frames(text: str) -> list[Location]:
    frames: list[Location] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        match = _FRAME_LINE.match(line)
        if match is None:
            continue
        frames.append(
            Location(
                path=match["path"],
                line=max(int(match["line"]), 1),
                snippet=_snippet_after(lines, i),
                function=match["func"],
            )
        )
    return frames


def _snippet_after(lines: list[str], index: int) -> str | None:
    """The source line printed under frame line ``index``, if there is one."""
    if index + 1 >= len(lines):
        return None
    candidate = lines[index + 1]
    frame_indent = len(lines[index]) - len(lines[index].lstrip())
    indent = len(candidate) - len(candidate.lstrip())
    # The source line is indented deeper than its "File" line; the next frame is not.
    if indent <= frame_indent or _FRAME_LINE.match(candidate) or _MARKER_LINE.match(candidate):
        return None
    return candidate.strip() or None


def _from_summary(summary: traceback.FrameSummary) -> Location:
    line = summary.lineno or 1
    return Location(
        path=summary.filename,
        line=max(line, 1),
        column=_column_from_byte_offset(summary.filename, line, getattr(summary, "colno", None)),
        snippet=(summary.line or None),
        function=summary.name,
    )


def _column_from_byte_offset(path: str, line: int, colno: int | None) -> int | None:
    """Convert CPython's 0-based UTF-8 byte offset into a 1-based code point column."""
    if colno is None:
        return None
    source = linecache.getline(path, line)
    if not source:
        return None
    prefix = source.encode("utf-8")[:colno].decode("utf-8", errors="ignore")
    return len(prefix) + 1
