"""How many frames an audio tower's convolutions and pooling leave of a clip: transformers
says so through a method of its audio towers without a public name, reached here only."""

from __future__ import annotations

import torch


def tower_output_lengths(tower: torch.nn.Module, frames: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """An audio tower's lengths after its convolutions and after its pooling, of clips of
    ``frames`` feature frames: transformers' `_get_feat_extract_output_lengths`, a method
    of its audio towers without a public name (the one place fx2onnx calls it)."""
    return tower._get_feat_extract_output_lengths(frames)


def counts_output_lengths(tower: object) -> bool:
    """Whether ``tower`` says its output lengths (`tower_output_lengths` can ask it)."""
    return hasattr(tower, "_get_feat_extract_output_lengths")
