"""Write report files atomically, so a crash never leaves a half-written report."""

from __future__ import annotations

import gzip
import os
import secrets
from pathlib import Path


def check_report_path(path: str | os.PathLike[str], compress: bool) -> Path:
    """Return ``path`` as a Path if its extension fits ``compress``, else ValueError."""
    target = Path(path)
    required = ".sarif.gz" if compress else ".sarif"
    if not target.name.endswith(required) or target.name == required:
        raise ValueError(
            f"A {'compressed ' if compress else ''}SARIF report must be written to a file "
            f"ending in {required!r}; got {str(path)!r}."
        )
    return target


def write_atomically(path: Path, data: str, compress: bool = False) -> None:
    """Write ``data`` (UTF-8, gzip when ``compress``) to ``path`` in one step.

    The bytes go to a temporary file in the same directory, which then replaces
    ``path``: readers see the old file or the complete new one, never a part.
    """
    payload = data.encode("utf-8")
    if compress:
        payload = gzip.compress(payload, mtime=0)  # mtime=0: same input, same bytes
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        # "xb" creates a new file with the usual umask permissions (mkstemp gives 0600).
        with open(temp, "xb") as stream:
            stream.write(payload)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
