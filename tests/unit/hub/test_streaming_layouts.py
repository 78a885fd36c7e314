"""The streaming audio layouts' table and VoxtralRealtime's chunk arithmetic (the folder
itself is checked end to end in tests/e2e/test_export_hf_audio_language.py and, in
Transformers.js, tests/e2e/test_transformers_js.py)."""

from __future__ import annotations

import torch
import transformers

from fx2onnx.hub.audio_language import streaming_layouts, voxtral_realtime, voxtral_realtime_verification


def test_only_streaming_model_types_have_a_streaming_layout():
    layout = streaming_layouts.streaming_layout("voxtral_realtime")
    assert layout.export_parts is voxtral_realtime.export_parts
    assert layout.verify is voxtral_realtime_verification.verify_voxtral_realtime
    assert "default_num_delay_tokens" in layout.client
    assert streaming_layouts.streaming_layout("voxtral") is None
    assert streaming_layouts.streaming_layout(None) is None


def test_a_chunks_encoder_positions_are_its_strided_convolutions_outputs():
    convolution = torch.nn.Conv1d(1, 1, kernel_size=3, stride=2)
    for frames in (8, 16, 24, 40):
        padded = torch.zeros(1, 1, voxtral_realtime.CONV2_LEFT + frames)
        assert voxtral_realtime.encoder_positions(frames) == convolution(padded).shape[-1]


def test_the_first_chunks_padding_cache_is_zeros_of_the_clients_shape():
    config = transformers.VoxtralRealtimeConfig()
    cache = voxtral_realtime.zero_padding_cache(config)
    audio = config.audio_config
    assert cache.shape == (1, audio.num_mel_bins + audio.hidden_size, voxtral_realtime.PADDING_COLUMNS)
    assert not cache.any()
