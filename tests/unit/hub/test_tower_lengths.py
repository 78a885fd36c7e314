"""The audio towers' output lengths that the audio-text-to-text folder counts tokens with are a
method of transformers' without a public name: this fails loudly if transformers moves it."""

from __future__ import annotations

import pytest
import torch

from fx2onnx.hub.audio_language.tower_lengths import counts_output_lengths, tower_output_lengths

transformers = pytest.importorskip("transformers")


def test_qwen2_audio_tower_counts_frames_after_its_convolution_and_pooling() -> None:
    config = transformers.Qwen2AudioEncoderConfig(d_model=16, encoder_layers=1, encoder_attention_heads=2,
                                                  encoder_ffn_dim=32, num_mel_bins=8, max_source_positions=50)
    tower = transformers.Qwen2AudioEncoder(config)
    assert counts_output_lengths(tower) and not counts_output_lengths(torch.nn.Linear(2, 2))
    after_convolution, after_pooling = tower_output_lengths(tower, torch.tensor([100, 37]))
    # a stride-2 convolution ((n - 1) // 2 + 1), then a pooling of 2 ((n - 2) // 2 + 1)
    assert after_convolution.tolist() == [50, 19] and after_pooling.tolist() == [25, 9]
