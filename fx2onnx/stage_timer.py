"""Wall-clock time per export stage, so each stage can be measured on its own."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class StageTimer:
    """Accumulates seconds per stage name; `on_stage` hears each stage as it starts
    (the progress bar)."""

    def __init__(self, on_stage: Callable[[str], None] | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self._on_stage = on_stage

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if self._on_stage is not None:
            self._on_stage(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
