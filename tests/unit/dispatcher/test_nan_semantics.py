"""Reductions and comparisons propagate NaN as PyTorch does."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from conftest import Apply, check_saved_model, export_program, flat_leaves

NAN = float("nan")
X = torch.tensor([[1.0, NAN, 3.0, -1.0], [2.0, 5.0, 0.5, 4.0], [NAN, 1.0, NAN, 7.0]])
Y = torch.tensor([[NAN, 2.0, 1.0, 9.0], [1.0, NAN, 2.0, 3.0], [0.0, 0.25, 1.0, NAN]])  # no ties: their order is unspecified

CASES: dict[str, Callable[[torch.Tensor, torch.Tensor], object]] = {
    "max": lambda a, b: a.max(),
    "min": lambda a, b: a.min(),
    "max_dim": lambda a, b: a.max(dim=-1),
    "min_dim_keepdim": lambda a, b: a.min(dim=1, keepdim=True),
    "amax": lambda a, b: a.amax(-1),
    "amax_all": lambda a, b: a.amax(),
    "amin": lambda a, b: a.amin((0, 1)),
    "amin_dim0": lambda a, b: a.amin(0, keepdim=True),
    "argmax": lambda a, b: a.argmax(-1),
    "argmax_all": lambda a, b: a.argmax(),
    "argmin": lambda a, b: a.argmin(0),
    "argmin_keepdim": lambda a, b: a.argmin(1, keepdim=True),
    "maximum": lambda a, b: torch.maximum(a, b),
    "minimum": lambda a, b: torch.minimum(a, b),
    "clamp": lambda a, b: a.clamp(0.5, 4.0),
    "clamp_min": lambda a, b: a.clamp(min=2.0),
    "clamp_tensor": lambda a, b: a.clamp(b, b + 1),
    "sort": lambda a, b: a.sort(-1),
    "sort_descending": lambda a, b: a.sort(0, descending=True),
    "topk": lambda a, b: a.topk(2, -1),
    "topk_smallest": lambda a, b: a.topk(2, -1, largest=False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_nan_propagates_like_pytorch(name: str, tmp_path) -> None:
    model = Apply(CASES[name])
    program = export_program(model, (X, Y), tmp_path=tmp_path)
    check_saved_model(program, tmp_path / "m.onnx")
    for a, b in ((X, Y), (Y, X), (torch.randn(3, 4), torch.randn(3, 4))):
        expected = flat_leaves(model(a, b))
        actual = flat_leaves(program(a, b))
        assert len(actual) == len(expected)
        for got, want in zip(actual, expected):
            assert got.dtype == want.dtype and got.shape == want.shape
            torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)


def test_integer_reductions_keep_torchlib_functions(export_and_compare) -> None:
    x = torch.tensor([[3, -1, 7], [2, 9, 0]])
    export_and_compare(Apply(lambda a, b: (a.amax(-1), a.max(dim=0), a.argmin(), b.min())), (x, x + 1))


@pytest.mark.parametrize("dim", [0, -1, (0,)])
def test_reductions_of_a_0d_tensor_along_dim_0(dim, export_and_compare) -> None:
    # PyTorch treats a 0-d tensor as having one dim here; ONNX reductions refuse axes on it.
    reductions = Apply(lambda a, b: (a.amax(dim), a.amin(dim, keepdim=True), a.max(dim=0), b.amin(dim)))
    export_and_compare(reductions, (torch.tensor(2.5), torch.tensor(-1.0)))
