"""Gemma 3n's audio attention, its queries padded to whole chunks whatever their count.

Gemma 3n's conformer attends within chunks of `conf_attention_chunk_size` frames: it pads
the queries to a whole number of chunks only where the count is not one already
(`Gemma3nAudioAttention._convert_to_block`: `if padding_len > 0`). That branch is on the
clip's length: a capture keeps the example's side, so a clip of the other kind would be
reshaped to chunks it does not fill (or left unpadded), and fx2onnx warns of it. During a
capture the queries are padded by the count's remainder always: by no frames where the
count is whole, the same blocks as transformers' on either side.

Knows transformers only by name (library_adapters.CAPTURE_REWRITES): never imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def chunks_padded_always(original: Callable[..., Any]) -> Callable[..., Any]:
    """``_convert_to_block(self, hidden_states)`` ([batch, time, ...] -> [batch, chunks, chunk
    size, ...]) padding by ``chunks x chunk size - time`` frames, zero of them included."""

    def _convert_to_block(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
        batch, time = hidden_states.shape[:2]
        chunks = (time + self.chunk_size - 1) // self.chunk_size
        padded = self._pad_dim1(hidden_states, 0, chunks * self.chunk_size - time)
        return padded.reshape(batch, chunks, self.chunk_size, *hidden_states.shape[2:]).contiguous()

    _convert_to_block.__wrapped__ = original  # type: ignore[attr-defined]
    return _convert_to_block
