"""Gemma 3n's audio attention with its queries padded to whole chunks whatever their count
during a capture (library_adapters.CAPTURE_REWRITES): transformers' outputs on clips that
fill their chunks and clips that do not, eager and exported from either kind."""

from __future__ import annotations

import warnings

import pytest
import torch

import fx2onnx
from fx2onnx.capture.library_adapters import rewritten_library_functions

transformers = pytest.importorskip("transformers")


def _attention() -> torch.nn.Module:
    from transformers.models.gemma3n import modeling_gemma3n as gemma3n

    # the checkpoints' chunks of 12 frames and left context of 13
    config = transformers.Gemma3nAudioConfig(hidden_size=16, conf_num_attention_heads=2)
    torch.manual_seed(0)
    return gemma3n.Gemma3nAudioAttention(config).eval()


def _inputs(frames: int, held: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of two clips of ``frames`` frames, the second's past ``held`` padding (true in the mask)."""
    hidden = torch.randn(2, frames, 16, generator=torch.Generator().manual_seed(frames))
    return hidden, torch.arange(frames).expand(2, frames) >= torch.tensor([[frames], [held]])


@pytest.mark.parametrize("frames", [24, 30])
def test_whole_and_partial_chunks_are_transformers_blocks(frames: int) -> None:
    attention = _attention()
    hidden = torch.randn(2, frames, 2, 8)
    want = attention._convert_to_block(hidden)
    with rewritten_library_functions():
        assert attention._convert_to_block.__func__.__wrapped__  # the rewrite is in place
        got = attention._convert_to_block(hidden)
    assert got.shape == (2, -(-frames // 12), 12, 2, 8)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("frames, other", [(30, 24), (24, 30)])
def test_the_attention_exports_for_either_kind_of_clip(export_and_compare, frames: int, other: int) -> None:
    """Exported from a clip that does not fill its chunks (or one that does), the attention gives
    transformers' output on the other kind, with no warning of a branch on the length."""
    time = torch.export.Dim.AUTO
    options = fx2onnx.ExportOptions(dynamic_shapes={"hidden_states": {1: time}, "mask": {1: time}})
    with warnings.catch_warnings():
        # the capture's warning of a branch on a dynamic size an error
        warnings.filterwarnings("error", message=".*branches on the dynamic input sizes")
        export_and_compare(_attention(), _inputs(frames, frames - 5), options=options,
                           second_inputs=(_inputs(other, other - 7), {}))
