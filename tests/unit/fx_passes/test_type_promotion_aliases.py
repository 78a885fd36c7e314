"""ATen aliases (divide, multiply, subtract, greater...) are promoted like the operators
they name: a float tensor divided by an int64 tensor computes in float."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from conftest import Apply

ALIASES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "divide": torch.divide,
    "divide_floor": lambda a, b: torch.divide(a, b, rounding_mode="floor"),
    "true_divide": torch.true_divide,
    "multiply": torch.multiply,
    "subtract": torch.subtract,
    "greater": torch.greater,
    "less_equal": torch.less_equal,
    "not_equal": torch.not_equal,
    "arctan2": torch.arctan2,
    "divide_in_place": lambda a, b: a.clone().divide_(b),
}


@pytest.mark.parametrize("name", sorted(ALIASES))
def test_alias_promotes_float_and_int64(name, export_and_compare) -> None:
    a = torch.tensor([[1.5, -2.0, 3.25], [4.0, 0.5, -6.0]])
    b = torch.tensor([[2, 3, -1], [5, 2, 4]])
    export_and_compare(Apply(ALIASES[name]), (a, b))


def test_masked_var_of_a_mask_count(export_and_compare) -> None:
    # masked.var divides a float sum by an int64 count with aten.divide
    x = torch.randn(3, 4)
    mask = torch.tensor([[True, False, True, True], [False, True, True, False], [True, True, True, True]])
    export_and_compare(Apply(lambda t, m: torch.masked._ops.var(t, 1, unbiased=True, mask=m)), (x, mask))
