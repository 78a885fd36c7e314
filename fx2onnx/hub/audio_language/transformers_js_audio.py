"""The audio-text-to-text folder in Transformers.js: its `AudioTextToText` classes load
`audio_encoder`, `embed_tokens` and `decoder_model_merged`, run the audio encoder on the
inputs it picks by the encoder's input names, and put `audio_features` into the audio tokens'
rows (`config.audio_token_id`) in JavaScript, as audio_verification.py does.

Which model types it runs so is one table, each with the names its class feeds the encoder
under where they are not transformers' (Voxtral's `UltravoxModel` forwards the processor's
`audio_values`). VoxtralRealtime's class streams its audio through an encoder with a cache of
its own, another layout, which export-hf does not write: NOT_WRITTEN says what it is."""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from fx2onnx.hub.decoders.client_support import TRANSFORMERS_JS

# model type -> the audio encoder's inputs renamed as Transformers.js's class feeds them
TRANSFORMERS_JS_INPUTS: dict[str, dict[str, str]] = {
    "voxtral": {"input_features": "audio_values"},
    "granite_speech": {},
}


# model type -> the layout Transformers.js loads for it that export-hf does not write, and why
# (line numbers of its dist/transformers.node.mjs)
NOT_WRITTEN: dict[str, str] = {
    "voxtral_realtime": (
        "it streams: transformers adds the projected audio embeddings to the prompt's token embeddings one for one "
        "(inputs_embeds += audio_embeds, no audio token) and conditions every decoder layer on the delay "
        f"(num_delay_tokens through a time embedding and ada RMS norms). {TRANSFORMERS_JS}'s "
        "VoxtralRealtimeForConditionalGeneration (lines 31482-31648 of dist/transformers.node.mjs) loads "
        "audio_encoder, embed_tokens and decoder_model_merged, and runs the audio encoder chunk by chunk as the "
        "decoder asks for audio: input_features [1, num_mel_bins, frames], attention_mask and position_ids over the "
        "encoder's positions so far, past_padding_cache [1, num_mel_bins + audio hidden_size, 2] (the left padding "
        "of its two causal convolutions) and the encoder's own past_key_values.* -> audio_embeds (projected to the "
        "text width), present_padding_cache and present.*; it adds each audio embedding to one token's embedding in "
        "JavaScript and feeds decoder_model_merged inputs_embeds, attention_mask, position_ids and past_key_values "
        "alone (the delay's conditioning must then be fixed inside the decoder, at default_num_delay_tokens). "
        "export-hf does not write this streaming encoder (a convolution padding cache and a key/value cache "
        "carried across chunks) nor a decoder with the delay fixed."
    ),
}


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
    if model_type in TRANSFORMERS_JS_INPUTS:
        return (f"{TRANSFORMERS_JS} runs this folder (AutoModelForAudioTextToText, {model_type}) on the tokens and "
                "audio features transformers' processor gives. ONNX Runtime GenAI has no audio-text-to-text type.")
    return (f"{TRANSFORMERS_JS} has no audio-text-to-text class for {model_type}, nor ONNX Runtime GenAI a type: "
            "run the three models with onnxruntime as the verification chains them (the audio encoder, its features "
            "put into the audio tokens' rows of embed_tokens' output, then decoder_model_merged).")
