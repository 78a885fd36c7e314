"""Selection and search operators of dispatcher/functions/indexing.py match PyTorch."""

from __future__ import annotations

import pytest
import torch

from conftest import Apply


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_masked_select_broadcasts_input_and_mask(dtype, export_and_compare) -> None:
    x = torch.arange(12).reshape(3, 4).to(dtype)
    row_mask = torch.tensor([True, False, True, True])
    export_and_compare(Apply(torch.masked_select), (x, row_mask))
    column = torch.arange(3).reshape(3, 1).to(dtype)
    export_and_compare(Apply(torch.masked_select), (column, torch.rand(3, 4) > 0.5))


BOUNDARIES = torch.tensor([[1.0, 2.0, 2.0, 5.0, 7.0], [-3.0, 0.0, 0.0, 1.0, 9.0]])
VALUES = torch.tensor([[2.0, 0.0, 8.0], [0.0, -5.0, 9.5]])


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"right": True}, {"side": "right"}, {"side": "left", "right": False}, {"out_int32": True}],
    ids=["left", "right", "side_right", "side_left", "int32"],
)
def test_searchsorted_rows_and_sides(kwargs, export_and_compare) -> None:
    export_and_compare(Apply(lambda b, v: torch.searchsorted(b, v, **kwargs)), (BOUNDARIES, VALUES))
    # one sorted sequence for a value tensor of any shape
    export_and_compare(Apply(lambda b, v: torch.searchsorted(b[0], v, **kwargs)), (BOUNDARIES, VALUES.reshape(3, 2)))


def test_searchsorted_with_sorter_and_scalar(export_and_compare) -> None:
    unsorted = torch.tensor([5.0, 1.0, 7.0, 2.0])
    sorter = torch.argsort(unsorted)
    export_and_compare(Apply(lambda b, v, s: torch.searchsorted(b, v, sorter=s, right=True)), (unsorted, VALUES, sorter))
    export_and_compare(Apply(lambda b: torch.searchsorted(b, 2.0)), (BOUNDARIES[0],))
    ints = torch.tensor([1, 3, 3, 8])
    export_and_compare(Apply(lambda b, v: torch.searchsorted(b, v, side="right")), (ints, torch.tensor([3, 0, 9])))


def test_isin(export_and_compare) -> None:
    elements = torch.tensor([[1, 4, 7], [2, 9, 3]])
    test = torch.tensor([9, 2, 2, 5, 1, 0, 8, 6, 11, 12, 13, 14, 15, 16])
    export_and_compare(Apply(torch.isin), (elements, test))
    export_and_compare(Apply(lambda a, b: torch.isin(a, b, invert=True)), (elements, test))


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_index_reduce(reduce, include_self, dtype, export_and_compare) -> None:
    x = torch.tensor([[3, -7, 2, 5], [1, 4, -6, 0], [-2, 8, 9, -1]]).to(dtype)
    source = torch.tensor([[1, -3, 5], [2, 7, -4], [-5, 6, 3]]).to(dtype)
    index = torch.tensor([2, 0, 2])  # column 1 and 3 untouched, column 2 reduced twice

    def fn(t: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return t.index_reduce(1, i, s, reduce, include_self=include_self)

    export_and_compare(Apply(fn), (x, index, source))
    # 0-d self and source
    scalar = Apply(lambda t, i, s: t.index_reduce(0, i, s, reduce, include_self=include_self))
    export_and_compare(scalar, (x[0, 0], torch.tensor([0]), source[0, 0]))
