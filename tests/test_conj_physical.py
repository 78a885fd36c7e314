"""aten::_conj_physical on complex tensors (the Hermitian inverse FFTs reach it)."""

from __future__ import annotations

import torch


class IHfft2(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fft.ihfft2(x, norm="ortho")


class ConjOfComplex(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.view_as_complex(x)
        return torch.view_as_real(torch.conj_physical(z * z))


def test_ihfft2_conjugates_its_spectrum(export_and_compare) -> None:
    export_and_compare(IHfft2(), (torch.randn(2, 4, 6),))


def test_conj_physical_negates_imaginary_parts(export_and_compare) -> None:
    export_and_compare(ConjOfComplex(), (torch.randn(3, 4, 2),))
