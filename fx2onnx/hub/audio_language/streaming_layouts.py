"""The audio language models whose Transformers.js class streams the audio (an encoder run
chunk by chunk with caches of its own, its embeddings added to the tokens' rather than
replacing placeholder tokens): one row per model type, the module writing its three models
and the one verifying them as the client chains them. Every other architecture is written
from transformers' hooks (hooks.py, audio_parts.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import fx2onnx
from fx2onnx.hub.audio_language import voxtral_realtime, voxtral_realtime_verification
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.shared.verification import Tolerance, Verification


@dataclass(frozen=True)
class StreamingLayout:
    """A streaming architecture's folder: its programs ("audio", "embedding", "decoder") and
    their verification (files by part, the model, new tokens, tolerance)."""

    export_parts: Callable[[LoadedModel, fx2onnx.ExportOptions], dict[str, fx2onnx.ONNXProgram]]
    verify: Callable[[dict[str, Path], torch.nn.Module, int, Tolerance], Verification]
    client: str  # what the folder's note says of Transformers.js's class


STREAMING_LAYOUTS: dict[str, StreamingLayout] = {
    "voxtral_realtime": StreamingLayout(
        voxtral_realtime.export_parts, voxtral_realtime_verification.verify_voxtral_realtime,
        "VoxtralRealtimeForConditionalGeneration: its generate takes `input_features` as an iterable of mel chunks "
        "[1, num_mel_bins, frames] (frames a multiple of audio_length_per_tok) and encodes them as the tokens need "
        "audio, each audio embedding added to one token's; the decoder's delay conditioning is fixed at the config's "
        "default_num_delay_tokens",
    ),
}


def streaming_layout(model_type: str | None) -> StreamingLayout | None:
    """The streaming layout of ``model_type``, None for a model written from its hooks."""
    return STREAMING_LAYOUTS.get(model_type or "")
