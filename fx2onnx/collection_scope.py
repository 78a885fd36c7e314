"""Garbage collection during an export walks only what the export made.

A full collection visits every object the process tracks: torch, its lazily imported
parts, transformers and the user's model are millions of them, and an export allocates
enough to trigger several full collections (0.1 to 0.4 s each on the benchmark models,
up to a sixth of an export). The objects that exist when the export starts are put out of
the collector's reach for its duration (`gc.freeze`) and given back at its end
(`gc.unfreeze`): what the export makes and drops is still collected as usual. Once the
model is captured, the captured program and what it holds join them
(`freeze_survivors`): they live until the export ends anyway, and on large graphs the
collections that walked them again and again grew faster than the graph.

A process that freezes objects itself (a server that forks after `gc.freeze`) is left
alone: giving back its frozen objects would undo what it did on purpose.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
from collections.abc import Iterator

_ACTIVE = contextvars.ContextVar("fx2onnx_collection_scope", default=False)


@contextlib.contextmanager
def collect_new_objects_only() -> Iterator[None]:
    """Within the block, garbage collection skips the objects that existed before it."""
    if not gc.isenabled() or gc.get_freeze_count() > 0:
        yield
        return
    gc.freeze()
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
        gc.unfreeze()


def freeze_survivors() -> None:
    """Inside `collect_new_objects_only`: put the objects alive now out of reach too
    (young garbage is collected first); elsewhere nothing."""
    if _ACTIVE.get():
        gc.collect(1)
        gc.freeze()
