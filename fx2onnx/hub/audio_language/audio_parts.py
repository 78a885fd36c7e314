"""The three programs of an audio language model's folder: the audio encoder (the model's
own `get_audio_features` over the audio inputs, its batch and lengths dynamic where the
encoder allows it), and vision_language/parts.py's token embedding and decoder over
`inputs_embeds` (1-D positions)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch.export import Dim

import fx2onnx
from fx2onnx.hub.audio_language.audio_inputs import audio_inputs
from fx2onnx.hub.audio_language.hooks import AudioHooks
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.vision_language import parts as shared

EXPORT_BATCH = 3  # clips in the capture's example: a batch dim that is not 1 (nor 2: a slice [:-1] of 2 clips is 1, which torch.export fixes)


class AudioEncoder(torch.nn.Module):
    """`get_audio_features` of the whole model (held as `model`, so its weights keep the
    checkpoint's names), its features as rows of the language model's width."""

    def __init__(self, model: torch.nn.Module, hooks: AudioHooks) -> None:
        super().__init__()
        self.model = model
        self.hooks = hooks

    def forward(self, input_features: torch.Tensor | None = None, input_features_mask: torch.Tensor | None = None,
                feature_attention_mask: torch.Tensor | None = None, input_values: torch.Tensor | None = None,
                padding_mask: torch.Tensor | None = None, input_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        given = {"input_features": input_features, "input_features_mask": input_features_mask,
                 "feature_attention_mask": feature_attention_mask, "input_values": input_values,
                 "padding_mask": padding_mask, "input_ids": input_ids}
        return {"audio_features": self.hooks.features(self.model, given)}


def export_parts(
    loaded: LoadedModel, options: fx2onnx.ExportOptions, hooks: AudioHooks,
) -> dict[str, fx2onnx.ONNXProgram]:
    """The "audio", "embedding" and "decoder" programs of ``loaded``'s model."""
    audio = audio_inputs(loaded.model, hooks, Path(loaded.folder), EXPORT_BATCH)
    audio_options = dataclasses.replace(
        shared.without_causal_mask(options),
        dynamic_shapes={name: {index: Dim.AUTO for index in range(value.dim())} for name, value in audio.items()},
    )
    encoder = fx2onnx.dynamo_export(AudioEncoder(loaded.model, hooks).eval(), **audio, export_options=audio_options)
    hidden = int(loaded.config.text_config.hidden_size)
    inputs = shared.decode_step_over_embeds(loaded, shared.language_model_of(loaded.model), hidden, mrope=False)
    return {"audio": encoder, "embedding": shared.export_token_embedding(loaded, options),
            "decoder": shared.export_decoder(loaded, options, inputs)}
