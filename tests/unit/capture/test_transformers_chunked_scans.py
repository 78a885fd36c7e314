"""Mamba2-style chunked scans computed, during a capture, with a symbolic number of chunks
(library_adapters.CAPTURE_REWRITES): the same outputs and final states as transformers'
reference scan at every length, and a program captured from a prompt shorter than a chunk
that stays exact past it."""

from __future__ import annotations

import pytest
import torch

from fx2onnx.capture.library_adapters import CAPTURE_REWRITES
from fx2onnx.capture.libraries.transformers_chunked_scans import MAMBA2_SCAN_FAMILIES, scan_with_symbolic_chunks

modeling_mamba2 = pytest.importorskip("transformers.models.mamba2.modeling_mamba2")
CHUNK, HEADS, HEAD_DIM, GROUPS, STATE = 8, 4, 8, 2, 8


def _scan_inputs(length: int, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(2, length, HEADS, HEAD_DIM, generator=generator), torch.randn(2, length, HEADS, generator=generator),
            torch.randn(2, length, GROUPS, STATE, generator=generator), torch.randn(2, length, GROUPS, STATE, generator=generator),
            torch.randn(2, HEADS, HEAD_DIM, STATE, generator=generator))


class _Scan(torch.nn.Module):
    """A mixer's call of the scan: its decay, skip weights, time-step bias and limits."""

    def __init__(self, scan) -> None:
        super().__init__()
        self.scan = scan
        self.A = torch.nn.Parameter(-torch.linspace(0.5, 2.0, HEADS))
        self.D = torch.nn.Parameter(torch.linspace(0.1, 1.0, HEADS))
        self.dt_bias = torch.nn.Parameter(torch.linspace(-1.0, 1.0, HEADS))

    def forward(self, x, dt, B, C, state):
        return self.scan(x, dt, self.A, B, C, chunk_size=CHUNK, D=self.D, dt_bias=self.dt_bias, initial_states=state,
                         dt_softplus=True, dt_limit=(0.0, float("inf")), return_final_states=True)


def test_every_mamba2_family_has_the_rewrite() -> None:
    rewritten = {r.module for r in CAPTURE_REWRITES if r.attribute == "mamba2_chunk_scan"}
    assert rewritten == {f"transformers.models.{name}.modeling_{name}" for name in MAMBA2_SCAN_FAMILIES}


@pytest.mark.parametrize("length", [1, 3, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 2 * CHUNK + 3])
def test_the_scan_is_the_originals_at_every_length(length: int) -> None:
    original = _Scan(modeling_mamba2.mamba2_chunk_scan)
    rewritten = _Scan(scan_with_symbolic_chunks(modeling_mamba2.mamba2_chunk_scan))
    inputs = _scan_inputs(length, seed=length)
    (want, want_state), (got, got_state) = original(*inputs), rewritten(*inputs)
    assert got.shape == want.shape == (2, length, HEADS, HEAD_DIM)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_state, want_state, rtol=1e-5, atol=1e-6)


def test_packed_sequences_go_to_the_original() -> None:
    rewritten = scan_with_symbolic_chunks(modeling_mamba2.mamba2_chunk_scan)
    x, dt, B, C, _ = _scan_inputs(3, seed=0)
    with pytest.raises(ValueError, match="packed sequences"):
        rewritten(x, dt, -torch.ones(HEADS), B, C, CHUNK, seq_idx=torch.zeros(2, 3, dtype=torch.int32))


def test_a_capture_from_less_than_a_chunk_is_exact_past_it() -> None:
    """torch.export of the rewritten scan from 3 tokens keeps the number of chunks symbolic
    (the original's fails to capture with a dynamic length) and runs at 1 to 3 chunks."""
    model = _Scan(scan_with_symbolic_chunks(modeling_mamba2.mamba2_chunk_scan))
    length = torch.export.Dim("length", min=1, max=1024)
    program = torch.export.export(model, _scan_inputs(3, seed=0), strict=False,
                                  dynamic_shapes=({1: length}, {1: length}, {1: length}, {1: length}, None))
    reference = _Scan(modeling_mamba2.mamba2_chunk_scan)
    for size in (1, CHUNK, CHUNK + 1, 2 * CHUNK + 3):
        inputs = _scan_inputs(size, seed=size + 100)
        for got, want in zip(program.module()(*inputs), reference(*inputs)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
