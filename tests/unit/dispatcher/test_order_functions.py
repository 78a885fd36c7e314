"""cummax/cummin, kthvalue and mode (dispatcher/functions/order.py), exported in tiny
models, run in onnxruntime and compared with PyTorch: values and indices, PyTorch's index
on ties and NaN, every dimension, keepdim, integer and bool inputs, 0-d tensors."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from conftest import export_program

NAN = float("nan")
WITH_NAN = torch.tensor([[1.0, 3, 3, NAN, 5, NAN, 2], [2, 1, 1, 0, -1, 7, 7]])


class _Function(torch.nn.Module):
    def __init__(self, function: Callable) -> None:
        super().__init__()
        self.function = function

    def forward(self, x: torch.Tensor):
        return tuple(self.function(x))


def _check_identical(function: Callable, x: torch.Tensor) -> None:
    """Values (NaN where PyTorch has NaN) and indices exactly as PyTorch, same dtypes."""
    program = export_program(_Function(function), (x,))
    got, want = program(x), tuple(function(x))
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        g = torch.as_tensor(g)
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("name", ["cummax", "cummin"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumulative_ties_and_nan(name: str, dim: int) -> None:
    function = getattr(torch, name)
    _check_identical(lambda x: function(x, dim), WITH_NAN)


@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_cumulative_integer_bool_and_0d(name: str) -> None:
    function = getattr(torch, name)
    integers = torch.randint(0, 4, (3, 6, 2))
    _check_identical(lambda x: function(x, 1), integers)
    _check_identical(lambda x: function(x, 2), integers > 1)
    _check_identical(lambda x: function(x, 0), torch.tensor(2.5))


@pytest.mark.parametrize("k,dim,keepdim", [(2, 1, False), (3, -1, True), (1, 0, False)])
def test_kthvalue(k: int, dim: int, keepdim: bool) -> None:
    x = torch.randn(5, 6, 4)
    _check_identical(lambda t: torch.kthvalue(t, k, dim, keepdim), x)


def test_kthvalue_nan_is_largest_and_integers() -> None:
    # Without ties: among equal values PyTorch's selection picks an unspecified index.
    distinct = torch.tensor([[1.0, NAN, 0.5, 2.0], [NAN, -1.0, 4.0, 3.0]])
    _check_identical(lambda t: torch.kthvalue(t, 4, 1), distinct)
    _check_identical(lambda t: torch.kthvalue(t, 3, 1), distinct)
    _check_identical(lambda t: torch.kthvalue(t, 2, 0), torch.tensor([5, 3, 9, 1]))


@pytest.mark.parametrize("dim,keepdim", [(1, False), (0, True), (-1, False)])
def test_mode_smallest_most_frequent_at_its_last_index(dim: int, keepdim: bool) -> None:
    x = torch.randint(0, 4, (3, 6, 5))
    _check_identical(lambda t: torch.mode(t, dim, keepdim), x)


def test_mode_float_bool_and_0d() -> None:
    _check_identical(lambda t: torch.mode(t), torch.tensor([[5.0, 1.0, 1.0, 5.0, 2.0], [1, 2, 3, 4, 5]]))
    _check_identical(lambda t: torch.mode(t, 1), torch.randint(0, 4, (3, 6)) > 1)
    _check_identical(lambda t: torch.mode(t), torch.tensor(2.0))


class TopScores(torch.nn.Module):
    """A detector's post-processing: at most 4 of the scores over a threshold, the best first."""

    def forward(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kept = scores[scores > 0.5]
        return kept.topk(min(4, kept.size(0)))


def test_topk_of_a_count_known_only_at_run_time(tmp_path) -> None:
    program = export_program(TopScores(), (torch.rand(20),), tmp_path=tmp_path)
    for scores in (torch.rand(20), torch.rand(20) * 0.52, torch.zeros(20)):  # many, a few, none over 0.5
        values, indices = program(scores)
        expected_values, expected_indices = TopScores()(scores)
        torch.testing.assert_close(values, expected_values)
        torch.testing.assert_close(indices, expected_indices)
