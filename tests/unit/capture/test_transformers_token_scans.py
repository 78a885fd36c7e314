"""transformers' loops over the tokens (RecurrentGemma's linear recurrence, RWKV's time mix)
computed, during a capture, as a scan (library_adapters.CAPTURE_REWRITES): the same outputs
and final states as transformers' loop at every length, from no state and from a given one."""

from __future__ import annotations

import pytest
import torch

from fx2onnx.capture.library_adapters import CAPTURE_REWRITES
from fx2onnx.capture.libraries.transformers_token_scans import linear_recurrence_scan, wkv_scan

pytest.importorskip("transformers")
recurrent_gemma = pytest.importorskip("transformers.models.recurrent_gemma.modeling_recurrent_gemma")
rwkv = pytest.importorskip("transformers.models.rwkv.modeling_rwkv")
BATCH, WIDTH = 2, 8


def test_both_loops_are_rewritten() -> None:
    rewritten = {(r.module, r.attribute) for r in CAPTURE_REWRITES}
    assert (recurrent_gemma.__name__, "RecurrentGemmaRglru._rnn_scan") in rewritten
    assert (rwkv.__name__, "rwkv_linear_attention_cpu") in rewritten


@pytest.mark.parametrize("length", [1, 2, 7])
@pytest.mark.parametrize("given_state", [False, True])
def test_the_linear_recurrence_is_the_loops(length: int, given_state: bool) -> None:
    generator = torch.Generator().manual_seed(length)
    hidden = torch.randn(BATCH, length, WIDTH, generator=generator)
    gate = torch.rand(BATCH, length, WIDTH, generator=generator)
    reset = torch.zeros(BATCH, length, 1, dtype=torch.bool)
    reset[:, 0] = True  # the first token of a document: its gate is zeroed
    state = torch.randn(BATCH, WIDTH, generator=generator) if given_state else None
    original = recurrent_gemma.RecurrentGemmaRglru._rnn_scan
    expected = original(None, hidden, gate, reset, state)
    actual = linear_recurrence_scan(original)(None, hidden, gate, reset, state)
    for a, b in zip(actual, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("length", [1, 2, 7])
@pytest.mark.parametrize("given_state", [False, True])
def test_the_time_mix_is_the_loops(length: int, given_state: bool) -> None:
    generator = torch.Generator().manual_seed(length)
    decay, first = torch.randn(WIDTH, generator=generator), torch.randn(WIDTH, generator=generator)
    key, value = torch.randn(BATCH, length, WIDTH, generator=generator), torch.randn(BATCH, length, WIDTH, generator=generator)
    # a layer's slice of the model's state (batch, width, layers): not contiguous
    whole = torch.randn(3, BATCH, WIDTH, 2, generator=generator)
    state = [whole[0, :, :, 1], whole[1, :, :, 1].abs(), whole[2, :, :, 1]] if given_state else None
    original = rwkv.rwkv_linear_attention_cpu
    expected = original(decay, first, key, value, state=state, return_state=True)
    actual = wkv_scan(original)(decay, first, key, value, state=state, return_state=True)
    torch.testing.assert_close(actual[0], expected[0], rtol=0, atol=0)
    for a, b in zip(actual[1], expected[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert wkv_scan(original)(decay, first, key, value)[1] is None  # no state asked, none given
