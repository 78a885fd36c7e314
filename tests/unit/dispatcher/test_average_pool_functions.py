"""avg_pool2d/avg_pool3d with divisor_override (and without), compared with PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


class AvgPool(torch.nn.Module):
    def __init__(self, dims: int, **options) -> None:
        super().__init__()
        self.pool = F.avg_pool2d if dims == 2 else F.avg_pool3d
        self.options = options

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x, **self.options)


CASES = [
    ((1, 3, 9, 9), dict(kernel_size=3, stride=1, padding=1, ceil_mode=True, count_include_pad=False, divisor_override=2)),
    ((2, 3, 9, 9), dict(kernel_size=(6, 6), stride=(3, 3), padding=(2, 3), ceil_mode=True, divisor_override=2)),
    ((1, 1, 4, 4), dict(kernel_size=(2, 2), divisor_override=-2)),
    ((3, 7, 8), dict(kernel_size=2, stride=2, divisor_override=5)),  # unbatched
    ((2, 3, 9, 9), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),  # no override
    ((1, 2, 5, 5, 5), dict(kernel_size=(2, 3, 4), stride=(1, 2, 2), padding=(0, 1, 2), ceil_mode=True, divisor_override=2)),
    ((1, 1, 7, 5, 7), dict(kernel_size=(6, 3, 4), stride=(2, 3, 2), padding=(3, 1, 0), divisor_override=3)),
]


@pytest.mark.parametrize("shape, options", CASES)
def test_average_pool_matches_pytorch(shape, options, export_and_compare) -> None:
    dims = 3 if len(shape) == 5 else 2
    export_and_compare(AvgPool(dims, **options), (torch.randn(shape),))


def test_average_pool_with_divisor_of_integers(export_and_compare) -> None:
    x = torch.randint(-20, 20, (1, 2, 6, 6))
    export_and_compare(AvgPool(2, kernel_size=3, stride=2, padding=1, divisor_override=4), (x,))
