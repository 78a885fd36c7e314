"""Complex implementations of the operators fx2onnx adds: _conj_physical (the Hermitian
inverse FFTs reach it), prims::prod (cumprod), masked_select and the size of a complex dim."""

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


class ComplexOf(torch.nn.Module):
    """Applies ``fn`` to the complex tensor whose real form is the input."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        return torch.view_as_real(self.fn(torch.view_as_complex(x), *rest))


def test_complex_cumprod_and_prod(export_and_compare) -> None:
    x = torch.randn(3, 4, 2) * 0.8
    x[1, 2] = 0.0  # a zero factor
    export_and_compare(ComplexOf(lambda z: torch.cumprod(z, 1)), (x,))
    export_and_compare(ComplexOf(lambda z: torch.cumprod(z, 0)), (x,))


def test_complex_masked_select_keeps_pairs(export_and_compare) -> None:
    mask = torch.tensor([True, False, True, True])
    export_and_compare(ComplexOf(torch.masked_select), (torch.randn(3, 4, 2), mask))
