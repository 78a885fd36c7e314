"""End-to-end: complex tensors travel as real pairs; ONNXProgram takes and returns complex."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import make_options


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


class ForwardTransforms(nn.Module):
    """The forward FFTs of a real tensor at its own sizes (FNet's token mixing), each norm,
    of features whose width the weights fix."""

    def __init__(self) -> None:
        super().__init__()
        self.projection = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.projection(x)
        mixed = torch.fft.fftn(x, dim=(1, 2)).real
        both = torch.fft.fft2(x, norm="ortho").imag
        last = torch.fft.fft(x, dim=1, norm="forward").real
        return mixed + both + last


def _input_dims(program) -> list[list]:
    return [[d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim]
            for value in program.model_proto.graph.input]


def test_forward_ffts_of_real_tensors_keep_their_dims_dynamic(export_and_compare, tmp_path):
    # the composite kernels (and the fake kernel of _fft_r2c) read sizes as numbers and
    # would fix every dim to its example size: checked at another batch and length
    program = export_and_compare(
        ForwardTransforms(), (torch.randn(2, 7, 8),), options=make_options(tmp_path, dynamic_shapes=True),
        second_inputs=((torch.randn(3, 11, 8),), {}),
    )
    assert [isinstance(dim, str) for dim in _input_dims(program)[0]] == [True, True, False]  # batch, length; width 8


def test_fnet_mixes_tokens_at_any_batch_and_length(export_and_compare, tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.FNetConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                                     max_position_embeddings=64, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.FNetForMaskedLM(config).eval()

    def inputs(batch: int, length: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(3, 100, (batch, length))
        return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids)}

    program = export_and_compare(
        model, (), inputs(2, 7), options=make_options(tmp_path, dynamic_shapes=True), second_inputs=((), inputs(3, 12)),
    )
    assert all(isinstance(dim, str) for dims in _input_dims(program) for dim in dims)


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
