"""Progress of an export on the terminal: the stage running, and the FX nodes translated.

Drawn with `tqdm` on stderr, and only when stderr is a terminal. By default the bar
appears only once the export has lasted a few seconds (short exports print nothing);
`ExportOptions(progress=True)` shows it at once, `progress=False` never.

The interpreter reports each translated node through `node_translated()`; interpreters of
module-function bodies (created deeper in the translation) report to the same bar, which
is why the bar of the current export lives in a context variable.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import time
from collections.abc import Iterator
from typing import Any

# Seconds an export runs before its bar appears, unless progress is asked for explicitly.
AUTO_DELAY_SECONDS = 3.0

_CURRENT: contextvars.ContextVar["ExportProgress | None"] = contextvars.ContextVar("fx2onnx_progress", default=None)


def _stderr_is_terminal() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


class ExportProgress:
    """One bar per export: its description names the stage, its count the FX nodes."""

    def __init__(self, enabled: bool | None, description: str) -> None:
        self._bar: Any = None
        if enabled is False or not _stderr_is_terminal():
            return
        from tqdm.auto import tqdm

        self._delay = 0.0 if enabled else AUTO_DELAY_SECONDS
        self._start = time.monotonic()
        self._bar = tqdm(
            total=None,
            desc=description,
            unit="node",
            delay=self._delay,
            leave=False,
            file=sys.stderr,
            dynamic_ncols=True,
        )
        self._description = description

    @property
    def active(self) -> bool:
        return self._bar is not None

    def _refresh(self) -> None:
        # tqdm draws on an explicit refresh even before its delay has passed
        if time.monotonic() - self._start >= self._delay:
            self._bar.refresh()

    def stage(self, name: str) -> None:
        if self._bar is not None:
            self._bar.set_description_str(f"{self._description}: {name}", refresh=False)
            self._refresh()

    def start_nodes(self, total: int) -> None:
        if self._bar is not None:
            self._bar.total, self._bar.n = total, 0
            self._refresh()

    def advance(self, count: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(count)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    @contextlib.contextmanager
    def current(self) -> Iterator["ExportProgress"]:
        """Make this the bar that `node_translated()` advances."""
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)
            self.close()


def node_translated(count: int = 1) -> None:
    """Called by the interpreter after each FX node (and for the nodes of a reused module
    translation): advances the current export's bar."""
    progress = _CURRENT.get()
    if progress is not None and progress._bar is not None:
        progress._bar.update(count)


def start_translation(graph_module: Any) -> None:
    """The node count of the current export's bar: every node of the graph and of the
    graphs of its module calls."""
    progress = _CURRENT.get()
    if progress is None or not progress.active:
        return
    import torch.fx

    total = sum(len(m.graph.nodes) for m in graph_module.modules() if isinstance(m, torch.fx.GraphModule))
    progress.start_nodes(total)
