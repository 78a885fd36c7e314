"""Qwen3-ASR's audio features as one graph: its encoder attends within windows of the packed
post-convolution frames, whose boundaries transformers computes in Python from the mask's
values (`get_audio_cu_seqlens`: `.item()` and a loop over the clips) and then attends window by
window (a split by those lengths). Here the same boundaries are computed with tensor
operations and given to the encoder (its `cu_seqlens`), and attention within them is one
masked attention over the packed frames (a key is seen by the queries of its own window),
run as transformers' variable-length ("flash") path calls it."""

from __future__ import annotations

from typing import Any

import torch

from fx2onnx.hub.vision_language.parts import attention_implementation

_ATTENTION = "fx2onnx_flash_packed_windows"  # "flash" in the name: transformers passes the windows' boundaries


def _after_convolutions(lengths: torch.Tensor, window: int) -> torch.Tensor:
    """Frames after the encoder's convolutions of ``lengths`` mel frames cut in chunks of 2 * ``window``."""
    chunk = window * 2
    rest = ((lengths % chunk) - 1) // 2 + 1
    return ((rest - 1) // 2 + 1 - 1) // 2 + 1 + (lengths // chunk) * 13


def window_boundaries(mask: torch.Tensor, window: int, window_infer: int) -> torch.Tensor:
    """The packed frames' window boundaries (int32, from 0 to the total) of clips whose mel frames
    ``mask`` keeps: each clip's frames in windows of the longest chunk's frames times the
    inference windows per chunk, the last one shorter."""
    batch, frames = mask.shape
    chunk = window * 2
    chunk_lengths = mask.view(batch, frames // chunk, chunk).sum(-1).reshape(-1).to(torch.long)
    per_clip = _after_convolutions(mask.sum(-1).to(torch.long), window)
    size = _after_convolutions(chunk_lengths, window).max() * (window_infer // chunk)
    total = per_clip.sum()
    position = torch.arange(total, device=mask.device)
    starts = torch.cumsum(per_clip, 0) - per_clip
    clip = torch.searchsorted(torch.cumsum(per_clip, 0), position, right=True)
    opens = (position - starts[clip]) % size == 0
    boundaries = torch.cat([position[opens], total.reshape(1)])
    return boundaries.to(torch.int32)


def _packed_window_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: Any, scaling: float, dropout: float = 0.0, **kwargs: Any) -> tuple[Any, None]:
    """Attention over packed frames [1, heads, frames, dim] within the windows that
    `cu_seq_lens_q` bounds; the output [1, frames, heads, dim], as transformers' kernels give it."""
    boundaries = kwargs["cu_seq_lens_q"]
    position = torch.arange(query.shape[2], device=query.device)
    window = torch.searchsorted(boundaries[1:].to(torch.long), position, right=True)
    same = window[:, None] == window[None, :]
    output = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=same, scale=scaling)
    return output.transpose(1, 2), None


def audio_features(model: torch.nn.Module, audio: dict[str, torch.Tensor]) -> torch.Tensor:
    """The projected embeddings of ``audio`` (`input_features`, `input_features_mask`) as rows."""
    inner = model.model
    tower = inner.audio_tower
    config = tower.config
    mask = audio["input_features_mask"]
    boundaries = window_boundaries(mask, int(config.n_window), int(config.n_window_infer))
    with attention_implementation(config, _ATTENTION, _packed_window_attention):
        output = inner.get_audio_features(audio["input_features"], mask, cu_seqlens=boundaries, max_seqlen=0)
    return output.pooler_output
