"""The audio language models whose model has no `get_audio_features` (Qwen2-Audio), or one
torch.export cannot capture (Qwen3-ASR: windows from the mask's values in Python): one row per model type,
its audio inputs and the module computing the features as its forward does (a new one is a
module and a row here). Every other architecture is read through transformers' hooks
(hooks.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from fx2onnx.hub.audio_language import qwen2_audio, qwen3_asr


@dataclass(frozen=True)
class OwnFeatures:
    """An architecture's audio features: its inputs (the processor's names) and the function
    of (model, inputs) giving the projected embeddings."""

    inputs: tuple[str, ...]
    compute: Callable[[torch.nn.Module, dict[str, torch.Tensor]], torch.Tensor]


OWN_FEATURES: dict[str, OwnFeatures] = {
    "qwen2_audio": OwnFeatures(("input_features", "feature_attention_mask"), qwen2_audio.audio_features),
    "qwen3_asr": OwnFeatures(("input_features", "input_features_mask"), qwen3_asr.audio_features),
}
