"""Adaptive max and average pooling of any output size (windows overlapping or of unequal length)
matches PyTorch's values and indices."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


class AdaptiveMax(torch.nn.Module):
    def __init__(self, pool, output_size) -> None:
        super().__init__()
        self.pool = pool
        self.output_size = output_size

    def forward(self, x: torch.Tensor):
        return self.pool(x, self.output_size, return_indices=True)


@pytest.mark.parametrize(
    "pool, shape, output_size",
    [
        (F.adaptive_max_pool1d, (2, 3, 10), 4),
        (F.adaptive_max_pool1d, (3, 7), 5),
        (F.adaptive_max_pool2d, (1, 2, 7, 9), (3, 4)),
        (F.adaptive_max_pool2d, (2, 5, 6), (4, None)),
        (F.adaptive_max_pool2d, (1, 1, 3, 3), (5, 2)),  # output larger than input
        (F.adaptive_max_pool3d, (1, 2, 5, 4, 6), (2, 3, 4)),
    ],
    ids=["1d", "1d_unbatched", "2d", "2d_none", "2d_upsampled", "3d"],
)
def test_adaptive_max_pool(pool, shape, output_size, export_and_compare) -> None:
    export_and_compare(AdaptiveMax(pool, output_size), (torch.randn(*shape),))


def test_adaptive_max_pool_propagates_nan(tmp_path) -> None:
    from conftest import check_saved_model, export_program

    x = torch.randn(1, 1, 5, 5)
    x[0, 0, 1, 3] = float("nan")
    model = AdaptiveMax(F.adaptive_max_pool2d, (2, 2))
    program = export_program(model, (x,), tmp_path=tmp_path)
    check_saved_model(program, tmp_path / "m.onnx")
    (values, indices), (want_values, want_indices) = program(x), model(x)
    torch.testing.assert_close(values, want_values, equal_nan=True)
    torch.testing.assert_close(indices, want_indices)


def test_adaptive_max_pool_with_dynamic_sizes(export_and_compare, tmp_path) -> None:
    from conftest import make_options

    model = AdaptiveMax(F.adaptive_max_pool2d, (3, None))
    options = make_options(tmp_path, dynamic_shapes=True)
    export_and_compare(model, (torch.randn(2, 3, 7, 5),), options=options, second_inputs=((torch.randn(1, 2, 10, 5),), {}))


@pytest.mark.parametrize(
    "shape, output_size",
    [((1, 2, 5, 4, 6), (2, 3, 4)), ((2, 3, 7, 7, 7), (3, 3, 3)), ((3, 4, 6, 5), (4, None, 2)), ((1, 1, 2, 3, 2), (5, 4, 3))],
    ids=["unequal-windows", "overlapping", "unbatched-none", "upsampled"],
)
def test_adaptive_avg_pool3d(shape, output_size, export_and_compare) -> None:
    export_and_compare(torch.nn.AdaptiveAvgPool3d(output_size), (torch.randn(*shape),))


def test_adaptive_avg_pool2d_with_dynamic_sizes(export_and_compare, tmp_path) -> None:
    """Sizes whose remainders by the output size differ from the example's (8 and 16 by 3,
    then 10 and 7): windows of other lengths, read from the input's shape in the graph."""
    from conftest import make_options

    options = make_options(tmp_path, dynamic_shapes=True)
    export_and_compare(torch.nn.AdaptiveAvgPool2d(3), (torch.randn(2, 4, 8, 16),), options=options,
                       second_inputs=((torch.randn(1, 4, 10, 7),), {}))
