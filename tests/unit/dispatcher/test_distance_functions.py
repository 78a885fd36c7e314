"""torch.cdist (aten::_cdist_forward) for every kind of p matches PyTorch."""

from __future__ import annotations

import pytest
import torch


class Cdist(torch.nn.Module):
    def __init__(self, p: float, compute_mode: str = "use_mm_for_euclid_dist_if_necessary") -> None:
        super().__init__()
        self.p = p
        self.compute_mode = compute_mode

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.cdist(a, b, p=self.p, compute_mode=self.compute_mode)


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.0, 0.5, float("inf")])
def test_cdist_norms_with_broadcast_batches(p, export_and_compare) -> None:
    a = torch.randn(2, 4, 3)
    b = torch.randn(1, 5, 3)
    b[0, 0] = a[0, 0]  # a zero distance
    export_and_compare(Cdist(p), (a, b))


@pytest.mark.parametrize(
    "mode", ["use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist"]
)
def test_cdist_euclidean_compute_modes(mode, export_and_compare) -> None:
    # 30 rows: above PyTorch's threshold for the matrix-product form
    export_and_compare(Cdist(2.0, mode), (torch.randn(30, 4), torch.randn(7, 4)))
