"""During an export, garbage collection skips the objects that existed before it; after
it, everything is collectable again, and a process's own frozen objects stay frozen."""

from __future__ import annotations

import gc
import weakref

import torch

import fx2onnx
from fx2onnx.collection_scope import collect_new_objects_only, freeze_survivors


_FROZEN_WHILE_TRACED: list[int] = []


class _Probe(torch.nn.Module):
    """Notes how many objects are out of the collector's reach while it is traced."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _FROZEN_WHILE_TRACED.append(gc.get_freeze_count())
        return x.relu() + 1


def _export(model: torch.nn.Module) -> fx2onnx.ONNXProgram:
    options = fx2onnx.ExportOptions(failure_report_path=None)
    return fx2onnx.dynamo_export(model, torch.randn(2, 3), export_options=options)


def test_export_freezes_old_objects_and_gives_them_back() -> None:
    assert gc.get_freeze_count() == 0
    _FROZEN_WHILE_TRACED.clear()
    model = _Probe()
    program = _export(model)
    assert _FROZEN_WHILE_TRACED and min(_FROZEN_WHILE_TRACED) > 1000
    assert gc.get_freeze_count() == 0
    x = torch.randn(2, 3)
    torch.testing.assert_close(program(x), model(x))


def test_a_process_that_froze_objects_keeps_them_frozen() -> None:
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        _FROZEN_WHILE_TRACED.clear()
        _export(_Probe())
        # frozen objects that die leave the count; none was given back (unfreeze empties it)
        assert gc.get_freeze_count() > 0.9 * before
        assert len(_FROZEN_WHILE_TRACED) == 1 and _FROZEN_WHILE_TRACED[0] <= before  # the export froze nothing more
    finally:
        gc.unfreeze()


def test_cycles_made_inside_the_scope_are_still_collected() -> None:
    class Node:
        pass

    with collect_new_objects_only():
        first, second = Node(), Node()
        first.other, second.other = second, first  # a reference cycle: only gc frees it
        watch = weakref.ref(first)
        del first, second
        gc.collect()
        assert watch() is None


def test_survivors_join_the_frozen_objects_only_inside_the_scope() -> None:
    freeze_survivors()  # outside a scope: nothing happens
    assert gc.get_freeze_count() == 0
    with collect_new_objects_only():
        before = gc.get_freeze_count()
        kept = [[index] for index in range(10_000)]  # alive: frozen by freeze_survivors
        freeze_survivors()
        assert gc.get_freeze_count() >= before + len(kept)
    assert gc.get_freeze_count() == 0
