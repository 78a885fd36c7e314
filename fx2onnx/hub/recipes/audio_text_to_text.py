"""The audio-text-to-text recipe: an audio language model (an audio encoder whose outputs
replace the audio tokens of a decoder-only language model's prompt; transformers files them
under sequence-to-sequence) in Transformers.js's audio-text-to-text layout:
`onnx/audio_encoder.onnx`, `onnx/embed_tokens.onnx` and `onnx/decoder_model_merged.onnx`
(audio_language/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import fx2onnx
from fx2onnx.hub.audio_language import audio_parts as parts
from fx2onnx.hub.audio_language.hooks import audio_hooks
from fx2onnx.hub.audio_language.streaming_layouts import streaming_layout
from fx2onnx.hub.audio_language.transformers_js_audio import client_note, name_encoder_inputs
from fx2onnx.hub.audio_language.audio_verification import verify_audio_text_to_text
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.precision.folder_precision import FLOAT_ONLY, precision_refusal
from fx2onnx.hub.recipes.folder_recipe import RecipeDefaults, Say
from fx2onnx.hub.request import ExportRequest, Refusal
from fx2onnx.hub.shared.dim_roles import name_dims_by_role
from fx2onnx.hub.shared.program_files import onnx_file, save_program
from fx2onnx.hub.shared.verification import Tolerance, Verification

# the models and their file names (Transformers.js's sessions of an AudioTextToText model)
PARTS = {"audio": "audio_encoder", "embedding": "embed_tokens", "decoder": "decoder_model_merged"}


def _files(loaded: LoadedModel) -> dict[str, str]:
    return {part: onnx_file(loaded, base) for part, base in PARTS.items()}


class AudioTextToTextRecipe(RecipeDefaults):
    """The audio encoder, the token embedding and the decoder, as Transformers.js loads them."""

    def accepts(self, loaded: LoadedModel, request: ExportRequest) -> Refusal | None:
        try:
            if streaming_layout(loaded.config.model_type) is None:  # a streaming one has its own module
                audio_hooks(loaded.model)
        except NotImplementedError as error:  # the hooks' refusal (UnsupportedArchitectureError), as raised
            return Refusal(type(error), str(error))
        if loaded.fake_context is not None:
            return Refusal(NotImplementedError, (
                "An audio-text-to-text folder is not written in fake mode: the audio encoder's input sizes are found by "
                "running its get_audio_features on the real weights. Export without --fake. Nothing was written."
            ))
        return precision_refusal(loaded, request, FLOAT_ONLY)

    def export(
        self, loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, request: ExportRequest, say: Say,
    ) -> list[str]:
        streaming = streaming_layout(loaded.config.model_type)
        programs = (streaming.export_parts(loaded, options) if streaming is not None
                    else parts.export_parts(loaded, options, audio_hooks(loaded.model)))
        files = []
        for part, path in _files(loaded).items():
            if part != "audio":  # the audio's dims are the clip's, no role a runtime names
                name_dims_by_role(programs[part].model)
            else:
                name_encoder_inputs(programs[part].model, loaded.config.model_type)
            files += save_program(programs[part], staging, path, loaded)
        return files

    def verify(
        self, loaded: LoadedModel, folder: Path, model: torch.nn.Module, request: ExportRequest, tolerance: Tolerance,
        say: Say,
    ) -> Verification:
        files = {part: folder / path for part, path in _files(loaded).items()}
        streaming = streaming_layout(loaded.config.model_type)
        if streaming is not None:
            return streaming.verify(files, model, request.tokens, tolerance)
        return verify_audio_text_to_text(files, model, audio_hooks(model), Path(loaded.folder), request.tokens, tolerance)

    def client_note(self, config: dict[str, Any], genai_config: bool) -> str | None:
        return client_note(config)  # ONNX Runtime GenAI has no audio-text-to-text type: the note says so


RECIPE = AudioTextToTextRecipe()
