"""Reductions of dispatcher/reduction_functions.py match PyTorch in onnxruntime."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch


class Apply(torch.nn.Module):
    def __init__(self, fn: Callable[..., object]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *tensors: torch.Tensor) -> object:
        return self.fn(*tensors)


X = torch.tensor([[1.5, -2.0, 0.0, 3.0], [0.5, 2.0, -1.0, 4.0], [2.0, 0.25, 1.0, -3.0]])


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.cumprod(x, 0),
        lambda x: torch.cumprod(x, -1),
        lambda x: torch.cumprod(x, 1, dtype=torch.float64),
        lambda x: torch.linalg.vander(x[0], N=3),
    ],
    ids=["cumprod0", "cumprod_last", "cumprod_dtype", "vander"],
)
def test_cumulative_products(fn, export_and_compare) -> None:
    export_and_compare(Apply(fn), (X,))


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_cumprod_of_integers_and_bools(dtype, export_and_compare) -> None:
    x = torch.tensor([[1, 2, 0, 3], [2, 1, 1, 5]]).to(dtype)
    export_and_compare(Apply(lambda t: torch.cumprod(t, 1)), (x,))
