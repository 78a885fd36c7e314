"""Safe file writing: every file fx2onnx writes (models, weight data, SARIF reports).

One set of rules for every destination:

- a symlink is followed: its target gets the new content, the link stays;
- a destination that exists and is not a regular file (a directory, FIFO, device or
  socket) is an error, and it is left untouched;
- missing parent folders are created;
- files are written under temporary names in the destination's own folder and moved in
  place with ``os.replace`` only once all of them are complete: readers see the old
  files or the new ones, never a part; temporary files are removed on every exit path,
  KeyboardInterrupt included;
- errors name the user's path, never a temporary one.

Pure standard library (no torch, no ONNX): fx2onnx's model saving uses it too.
"""

from __future__ import annotations

import gzip
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_TEMP_MARK = ".fx2onnx-tmp-"


class DestinationError(OSError):
    """A destination exists and is not a regular file (FIFO, device, socket)."""


def _kind_of(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def resolve_destination(path: str | os.PathLike[str]) -> Path:
    """The regular file that writing ``path`` replaces: symlinks are followed to their
    target. Raises (without touching anything) when it exists and is not a regular file."""
    user_path = os.fspath(path)
    target = Path(os.path.realpath(user_path))
    via_link = f" (a symlink to '{target}')" if os.path.islink(user_path) else ""
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return target
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(
            f"Cannot write '{user_path}'{via_link}: it is a directory. Give a file path "
            "inside it instead; the directory was left as it is."
        )
    if not stat.S_ISREG(mode):
        raise DestinationError(
            f"Cannot write '{user_path}'{via_link}: it is {_kind_of(mode)}, not a regular "
            "file. Give the path of a regular file; it was left as it is."
        )
    return target


def _process_is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: it exists, under another user
        return True
    return True


def remove_leftovers(final: Path) -> None:
    """Delete the temporary files of ``final`` that a killed process left (SIGKILL, power
    loss: no cleanup ran). Only files named by this module's rule, of a dead process."""
    prefix = f".{final.name}{_TEMP_MARK}"
    try:
        candidates = [entry for entry in os.scandir(final.parent) if entry.name.startswith(prefix)]
    except OSError:
        return  # the folder cannot be listed: writing there will report the problem
    for entry in candidates:
        pid, _, token = entry.name[len(prefix):].partition("-")
        if pid.isdigit() and len(token) == 8 and entry.is_file(follow_symlinks=False) and not _process_is_alive(int(pid)):
            Path(entry.path).unlink(missing_ok=True)


class StagedFiles:
    """Files written under temporary names beside their destinations, then moved in place
    together by `commit`. Use through `staged_files()`, which cleans up."""

    def __init__(self) -> None:
        # (temporary path, final path, the path as the user gave it)
        self._staged: list[tuple[Path, Path, str]] = []
        self._remove_after_commit: list[Path] = []

    def stage(self, destination: str | os.PathLike[str]) -> Path:
        """Check ``destination``, create its parent folders, and return the temporary
        path to write its content to (created empty, only this process writes it)."""
        final = resolve_destination(destination)
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(final)
        temp = final.with_name(f".{final.name}{_TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")
        # Register first: whatever happens next, the temporary file is removed.
        self._staged.append((temp, final, os.fspath(destination)))
        # "x" creates a new file with the usual umask permissions (mkstemp gives 0600).
        with open(temp, "xb"):
            pass
        return temp

    def remove_after_commit(self, path: str | os.PathLike[str]) -> None:
        """Delete ``path`` once the new files are in place (a file they make stale)."""
        self._remove_after_commit.append(Path(path))

    def commit(self) -> None:
        for temp, final, _ in self._staged:
            # Checked again: the destination may have changed while the content was written.
            resolve_destination(final)
            os.replace(temp, final)
        for path in self._remove_after_commit:
            path.unlink(missing_ok=True)
        self._staged.clear()

    def discard(self) -> None:
        for temp, _, _ in self._staged:
            try:
                temp.unlink(missing_ok=True)
            except OSError:
                pass  # the folder itself is gone or read-only: nothing of ours is left in it
        self._staged.clear()

    def user_path_of(self, path: str | os.PathLike[str] | None) -> str | None:
        """The user's path for one of the temporary or final paths, else None."""
        if path is None:
            return None
        for temp, final, user_path in self._staged:
            if os.fspath(path) in (os.fspath(temp), os.fspath(final)):
                return user_path
        return None


@contextmanager
def staged_files() -> Iterator[StagedFiles]:
    """Write several files as one step.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> with staged_files() as files:  # both files appear at the end, or neither
    ...     files.stage(folder / "model.onnx").write_bytes(b"graph")
    ...     files.stage(folder / "model.onnx.data").write_bytes(b"weights")
    5
    7
    >>> sorted(path.name for path in folder.iterdir())
    ['model.onnx', 'model.onnx.data']
    >>> import shutil; shutil.rmtree(folder)
    """
    staged = StagedFiles()
    try:
        yield staged
        staged.commit()
    except OSError as error:
        user_path = staged.user_path_of(error.filename)
        if user_path is None or error.errno is None:
            raise
        # The same error, naming the user's path instead of the temporary one.
        raise type(error)(error.errno, error.strerror, user_path) from error
    finally:
        staged.discard()


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


def write_atomically(path: str | os.PathLike[str], data: str | bytes, compress: bool = False) -> None:
    """Write ``data`` (str as UTF-8, gzip when ``compress``) to ``path`` in one step, by
    the rules of this module."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    if compress:
        payload = gzip.compress(payload, mtime=0)  # mtime=0: same input, same bytes
    with staged_files() as files:
        temp = files.stage(path)
        with open(temp, "wb") as stream:
            stream.write(payload)
            stream.flush()
            os.fsync(stream.fileno())
