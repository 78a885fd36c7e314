"""The audio-text-to-text folder in Transformers.js: its `AudioTextToText` classes load
`audio_encoder`, `embed_tokens` and `decoder_model_merged`, run the audio encoder on the
inputs it picks by the encoder's input names, and put `audio_features` into the audio tokens'
rows (`config.audio_token_id`) in JavaScript, as audio_verification.py does.

Which model types it runs so is one table, each with the names its class feeds the encoder
under where they are not transformers' (Voxtral's `UltravoxModel` forwards the processor's
`audio_values`). VoxtralRealtime's class streams its audio through an encoder with caches of
its own, another layout, written by its own module (streaming_layouts.py)."""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from fx2onnx.hub.audio_language.streaming_layouts import streaming_layout
from fx2onnx.hub.decoders.client_support import TRANSFORMERS_JS

# model type -> the audio encoder's inputs renamed as Transformers.js's class feeds them
TRANSFORMERS_JS_INPUTS: dict[str, dict[str, str]] = {
    "voxtral": {"input_features": "audio_values"},
    "granite_speech": {},
}


# model type -> the layout Transformers.js loads for it that export-hf does not write, and why
# (line numbers of its dist/transformers.node.mjs); none now: VoxtralRealtime's streaming layout is
# written by its own module (streaming_layouts.py)
NOT_WRITTEN: dict[str, str] = {}


def not_written(model_type: str | None) -> str | None:
    """Why export-hf writes no audio-text-to-text folder for ``model_type`` although
    Transformers.js has a class for it (its layout, NOT_WRITTEN), or None."""
    return NOT_WRITTEN.get(model_type or "")


def encoder_input_names(model_type: str | None) -> dict[str, str]:
    """transformers' name -> the folder's, for the audio encoder of ``model_type``."""
    return TRANSFORMERS_JS_INPUTS.get(model_type or "", {})


def name_encoder_inputs(model: ir.Model, model_type: str | None) -> None:
    """The audio encoder's inputs named as Transformers.js feeds those of ``model_type``."""
    renamed = encoder_input_names(model_type)
    for value in model.graph.inputs:
        value.name = renamed.get(value.name, value.name)


def client_note(config: dict[str, Any]) -> str:
    """What export-hf says of the folder's clients for the model of ``config`` (config.json)."""
    model_type = config.get("model_type")
    streaming = streaming_layout(model_type)
    if streaming is not None:
        return (f"{TRANSFORMERS_JS} runs this folder (AutoModelForAudioTextToText, {streaming.client}). "
                "ONNX Runtime GenAI has no audio-text-to-text type.")
    if model_type in TRANSFORMERS_JS_INPUTS:
        return (f"{TRANSFORMERS_JS} runs this folder (AutoModelForAudioTextToText, {model_type}) on the tokens and "
                "audio features transformers' processor gives. ONNX Runtime GenAI has no audio-text-to-text type.")
    return (f"{TRANSFORMERS_JS} has no audio-text-to-text class for {model_type}, nor ONNX Runtime GenAI a type: "
            "run the three models with onnxruntime as the verification chains them (the audio encoder, its features "
            "put into the audio tokens' rows of embed_tokens' output, then decoder_model_merged).")
