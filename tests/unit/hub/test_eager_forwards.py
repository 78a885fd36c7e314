"""`loading.eager_forwards`: the context a recipe runs its model in outside a capture."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from fx2onnx.hub.loading import eager_forwards


class _Counted:
    """A context manager that counts how often it is entered and left."""

    def __init__(self) -> None:
        self.entered = self.left = 0

    def __enter__(self) -> None:
        self.entered += 1

    def __exit__(self, *exc_info) -> None:
        self.left += 1


def test_the_same_context_may_be_entered_again_after_it_exits():
    mode = _Counted()
    loaded = SimpleNamespace(fake_context=SimpleNamespace(fake_mode=mode), model=torch.nn.Linear(2, 2))
    context = eager_forwards(loaded)
    for _ in range(2):
        with context:
            assert mode.entered == mode.left + 1
    assert (mode.entered, mode.left) == (2, 2)


def test_a_real_model_runs_in_no_mode():
    loaded = SimpleNamespace(fake_context=None, model=torch.nn.Linear(2, 2))
    with eager_forwards(loaded):
        assert not isinstance(torch.ones(1), torch._subclasses.FakeTensor)
