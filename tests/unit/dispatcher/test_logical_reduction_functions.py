"""all/any along dims: 0-d tensors, empty slices, NaN, every dtype."""

from __future__ import annotations

import pytest
import torch


class Logical(torch.nn.Module):
    def __init__(self, dim, keepdim: bool) -> None:
        super().__init__()
        self.dim, self.keepdim = dim, keepdim

    def forward(self, x: torch.Tensor):
        return x.all(self.dim, keepdim=self.keepdim), x.any(self.dim, keepdim=self.keepdim)


@pytest.mark.parametrize(
    "x",
    [
        torch.tensor(0.0),
        torch.tensor(float("nan")),
        torch.tensor([[0.0, 1.0, float("nan")], [2.0, 3.0, -1.0]]),
        torch.tensor([[0, 4], [5, 6]]),
        torch.tensor([[True, False], [True, True]]),
        torch.zeros(3, 0),
    ],
)
@pytest.mark.parametrize("dim, keepdim", [(0, False), (-1, True), ((0,), False)])
def test_all_any_along_dims(x, dim, keepdim, export_and_compare) -> None:
    if x.dim() == 0 and isinstance(dim, tuple):
        dim = (0,)
    export_and_compare(Logical(dim, keepdim), (x,))
