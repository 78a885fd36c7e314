"""End-to-end: complex tensors travel as real pairs; ONNXProgram takes and returns complex."""

from __future__ import annotations

import torch
from torch import nn


class ComplexArithmetic(nn.Module):
    def forward(self, z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return z * w + z * 2 - 1


def test_complex_input_and_output(export_and_compare):
    z = torch.randn(3, 4, dtype=torch.complex64)
    w = torch.randn(3, 4, dtype=torch.complex64)
    program = export_and_compare(ComplexArithmetic(), (z, w))
    result = program(z, w)
    assert result.dtype == torch.complex64
    # the ONNX graph sees real tensors with a trailing dim of 2
    onnx_inputs = program.adapt_torch_inputs_to_onnx(z, w)
    assert [tuple(t.shape) for t in onnx_inputs] == [(3, 4, 2), (3, 4, 2)]
    assert [d.dim_value for d in program.model_proto.graph.input[0].type.tensor_type.shape.dim] == [3, 4, 2]


class RealFFT(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spectrum = torch.fft.rfft(x)
        return torch.fft.irfft(spectrum * 0.5, n=x.shape[-1])


def test_rfft_then_irfft(export_and_compare):
    export_and_compare(RealFFT(), (torch.randn(2, 16),))


class Spectrum(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fft.rfft(x)


def test_rfft_returns_complex(export_and_compare):
    program = export_and_compare(Spectrum(), (torch.randn(2, 16),))
    assert program(torch.randn(2, 16)).dtype == torch.complex64


class Rotary(nn.Module):
    """Rotary position embedding the LLaMA way: pairs of features as complex numbers."""

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * freqs).flatten(-2).type_as(x)


def test_rotary_embedding_view_as_complex(export_and_compare):
    freqs = torch.polar(torch.ones(6, 4), torch.randn(6, 4))
    export_and_compare(Rotary(), (torch.randn(2, 6, 8), freqs))


class RotaryBuffer(nn.Module):
    """The rotation table is a complex buffer: it becomes a real initializer."""

    def __init__(self) -> None:
        super().__init__()
        angles = torch.outer(torch.arange(6).float(), 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8))
        self.register_buffer("freqs", torch.polar(torch.ones_like(angles), angles))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * self.freqs).flatten(-2)


def test_rotary_with_complex_buffer(export_and_compare):
    export_and_compare(RotaryBuffer(), (torch.randn(2, 6, 8),))


def test_complex_operators_without_complex_function_are_decomposed(export_and_compare):
    """reshape/flatten/resolve_conj have only real torchlib functions; on complex tensors
    PyTorch's decompositions (view, which has a complex function) are used instead."""

    class ReshapeComplex(torch.nn.Module):
        def forward(self, z: torch.Tensor) -> torch.Tensor:
            return z.reshape(-1).flatten().resolve_conj().view(2, -1) * 2

    export_and_compare(ReshapeComplex(), (torch.randn(2, 3, dtype=torch.complex64),))


class CompositeOnComplex(torch.nn.Module):
    """einsum, tensordot and hstack have no complex function; their only decomposition is
    PyTorch's composite kernel, which must be run without recursing into the table."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        product = torch.einsum("ij,jk->ik", a, b)
        return torch.hstack([product, torch.tensordot(a, b, dims=1)])


def test_composite_operators_on_complex_tensors(export_and_compare):
    a = torch.randn(2, 3, dtype=torch.complex64)
    b = torch.randn(3, 4, dtype=torch.complex64)
    export_and_compare(CompositeOnComplex(), (a, b))
