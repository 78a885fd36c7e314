"""File paths to SARIF artifact URIs."""

from __future__ import annotations

import pathlib
import re

# "C:\x\y.py" or "C:/x/y.py": a Windows path, even when read on a POSIX machine.
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")


def is_pseudo_file(path: str) -> bool:
    """Python's names for code that is not in a file: ``<string>``, ``<eval_with_key>.3``."""
    return not path or path.startswith("<")


def file_uri(path: str) -> str | None:
    """An absolute, percent-encoded ``file:///`` URI for ``path``; None for pseudo-files.

    Relative paths are taken relative to the current directory, as Python does.
    """
    if is_pseudo_file(path):
        return None
    if path.startswith("file:"):
        return path
    if _WINDOWS_DRIVE.match(path) or path.startswith("\\\\"):
        return pathlib.PureWindowsPath(path).as_uri()
    return pathlib.Path(path).absolute().as_uri()
