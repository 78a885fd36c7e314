"""Checks of the files the command line will write, done before any work starts."""

from __future__ import annotations

import os
from pathlib import Path

from fx2onnx.cli.specs import UsageError

REPORT_SUFFIXES = (".sarif",)


def _real(path: Path) -> Path:
    """The path a write would reach: symlinks followed, relative parts resolved."""
    return Path(os.path.realpath(path))


def _check_destination(path: Path, what: str, flag: str) -> None:
    if path.is_dir():
        raise UsageError(f"{flag} '{path}' is a directory; give a file path inside it instead.")
    if path.exists() and not path.is_file():
        raise UsageError(
            f"{flag} '{path}' exists and is not a regular file (a device, a FIFO or a socket); "
            f"give a file path for the {what}."
        )
    parent = _real(path).parent
    ancestor = parent
    while not ancestor.exists():  # missing folders are created when the file is written
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UsageError(f"{flag} '{path}': '{ancestor}' is not a folder.")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} '{path}': the folder '{ancestor}' is not writable.")


def check_output_paths(output: Path, report: Path) -> None:
    """The model goes to `output`, the SARIF report to `report`: both writable regular
    files, different from each other, each named for what it holds."""
    if not report.name.endswith(REPORT_SUFFIXES) or report.name in REPORT_SUFFIXES:
        raise UsageError(f"--report '{report}': a SARIF report's name ends with .sarif, e.g. model.sarif.")
    if output.name.endswith(REPORT_SUFFIXES):
        raise UsageError(
            f"--output '{output}' is named like a SARIF report; give the model a name such as model.onnx."
        )
    data_file = _real(output).with_name(output.name + ".data")  # weights beside a large model
    if _real(output) == _real(report) or _real(report) == data_file or (
        output.exists() and report.exists() and os.path.samefile(output, report)
    ):
        raise UsageError(f"--output '{output}' and --report '{report}' are the same file; give them different names.")
    _check_destination(output, "model", "--output")
    _check_destination(report, "report", "--report")


def check_readable_file(path: Path, flag: str) -> None:
    if not path.is_file():
        raise UsageError(f"{flag} '{path}': no such file.")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{flag} '{path}': the file is not readable.")


__all__ = ["REPORT_SUFFIXES", "check_output_paths", "check_readable_file"]
