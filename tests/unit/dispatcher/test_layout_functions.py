"""Operators that only describe layout or aliasing: prims::view_of, aten::empty_permuted."""

from __future__ import annotations

import torch

from conftest import export_program, make_options, translated_fx_targets


class SqueezeDims(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.squeeze(x, (0, 2)) * 2  # dims 0 and 2 are not 1: nothing is squeezed


def test_squeeze_of_dims_that_are_not_one(export_and_compare) -> None:
    program = export_and_compare(SqueezeDims(), (torch.randn(5, 1, 5, 1),))
    assert program(torch.randn(5, 1, 5, 1)).shape == (5, 1, 5, 1)


class EmptyPermuted(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        empty = torch.empty_permuted((2, 3, 4), (0, 2, 1), dtype=torch.int64)
        return empty, x + 1


def test_empty_permuted_has_the_logical_size_and_dtype(tmp_path) -> None:
    x = torch.randn(3)
    program = export_program(EmptyPermuted(), (x,), options=make_options(tmp_path, optimize=False), tmp_path=tmp_path)
    assert "call_function:aten.empty_permuted.default" in translated_fx_targets(program.model_proto)
    empty, shifted = program(x)
    assert empty.shape == (2, 3, 4) and empty.dtype == torch.int64  # values of empty are unspecified
    torch.testing.assert_close(shifted, x + 1)
