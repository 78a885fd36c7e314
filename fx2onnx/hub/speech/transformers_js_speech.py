"""A speech encoder-decoder folder in Transformers.js (`AutoModelForSpeechSeq2Seq`,
MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES in dist/transformers.node.mjs): which model types
it runs, the processor files its `AutoProcessor` reads for them, and why it cannot run the
others. Line numbers are those of the 4.3.2 release's dist/transformers.node.mjs (4.3.1's code is the same).

Its `AutoProcessor` builds the class `preprocessor_config.json` names (`processor_class`),
else a bare processor around the feature extractor; a class with `uses_processor_config`
(CohereAsrProcessor) reads `processor_config.json` too, and fails without it. transformers 5
saves a processor as `processor_config.json` alone (the feature extractor's settings nested
under `feature_extractor`), and a feature extractor saved alone names no processor class:
the folder gets both files, written from whichever the source has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fx2onnx.hub.decoders.client_support import TRANSFORMERS_JS
from fx2onnx.hub.shared.json_files import write_json_file
from fx2onnx.hub.speech.audio_input import FEATURE_EXTRACTOR_FILE, PROCESSOR_FILE, feature_extractor_settings

# model type -> the processor class Transformers.js's AutoProcessor must build (its pipeline
# calls the class's own methods: CohereAsrProcessor.get_decoder_prompt_ids), None: the bare one
RUNS: dict[str, str | None] = {"moonshine": None, "cohere_asr": "CohereAsrProcessor"}

# model type -> why Transformers.js cannot transcribe with the folder
CANNOT: dict[str, str] = {
    "speecht5": (
        "its SpeechT5ForSpeechToText (line 31036) keeps PreTrainedModel's main_input_name `input_ids` and "
        "forward_params [input_ids, attention_mask] (lines 25653-25654), so `generate` drops `input_values` and "
        "encoder_forward (line 26288) feeds the encoder none (`Missing the following inputs: input_values`); its "
        "SpeechT5FeatureExtractor (line 18488) has no _call (`Must implement _call method in subclass`), and the "
        "automatic-speech-recognition pipeline throws for it (`does not support model type 'speecht5'`, lines 33707-33731)"
    ),
}


def write_processor_files(source: Path, staging: Path, model_type: str | None) -> list[str]:
    """The processor files Transformers.js reads for ``model_type``, written into ``staging``
    (the source's files copied later are kept out by these): `preprocessor_config.json` where
    the source has only transformers 5's `processor_config.json`, or where the processor class
    is to be named; `processor_config.json` where the class reads one and the source has none.
    Nothing for a model type Transformers.js does not run or a source without a feature extractor."""
    settings = feature_extractor_settings(source)
    if model_type not in RUNS or settings is None:
        return []
    processor_class = RUNS[model_type]
    if processor_class is None and (source / FEATURE_EXTRACTOR_FILE).is_file():
        return []  # copied as it is
    named = settings if processor_class is None else {**settings, "processor_class": processor_class}
    files = [write_json_file(staging, FEATURE_EXTRACTOR_FILE, named)]
    if processor_class is not None and not (source / PROCESSOR_FILE).is_file():
        files.append(write_json_file(staging, PROCESSOR_FILE, {"processor_class": processor_class}))
    return files


def _cross_heads_differ(config: dict[str, Any]) -> str | None:
    """Cohere ASR: Transformers.js sizes the cross-attention cache it starts with from the
    encoder's heads (`encoder_config.num_attention_heads`, lines 23440-23460), the model's
    has the decoder's `num_key_value_heads`: where they differ, the first step's empty cache
    does not fit the decoder's inputs."""
    encoder_heads = (config.get("encoder_config") or {}).get("num_attention_heads")
    decoder_heads = config.get("num_key_value_heads")
    if encoder_heads is None or encoder_heads == decoder_heads:
        return None
    return (f"{TRANSFORMERS_JS} gives the first step an empty cross-attention cache of {encoder_heads} heads (the "
            f"encoder's, lines 23440-23460 of dist/transformers.node.mjs) where the decoder's has {decoder_heads}: "
            "onnxruntime refuses those inputs, so Transformers.js cannot run this folder.")


def client_note(config: dict[str, Any]) -> str | None:
    """What export-hf says of the speech folder's clients, for config.json ``config``; None
    for Whisper (its own guide section) and for a model transformers does not file under
    speech sequence-to-sequence (a text encoder-decoder)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES

    model_type = config.get("model_type")
    if model_type == "whisper" or model_type not in MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES:
        return None
    genai = "ONNX Runtime GenAI has no type for it: run it with onnxruntime as --verify chains the encoder and decoder."
    if model_type in RUNS:
        mismatch = _cross_heads_differ(config) if model_type == "cohere_asr" else None
        if mismatch is not None:
            return f"{mismatch} {genai}"
        pipeline = (" (its automatic-speech-recognition pipeline builds Cohere ASR's prompt of ten tokens, "
                    "CohereAsrProcessor.get_decoder_prompt_ids)" if model_type == "cohere_asr" else "")
        return (f"{TRANSFORMERS_JS} runs this folder (AutoModelForSpeechSeq2Seq, {model_type}): its processor, "
                f"`generate` and automatic-speech-recognition pipeline{pipeline}. {genai}")
    if model_type in CANNOT:
        return (f"{TRANSFORMERS_JS} loads this folder but cannot transcribe with it (line numbers of its "
                f"dist/transformers.node.mjs): {CANNOT[model_type]}. {genai}")
    return (f"{TRANSFORMERS_JS} has no speech sequence-to-sequence class for {model_type} (its "
            f"MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES: speecht5, whisper, lite-whisper, moonshine, cohere_asr). {genai}")


# model types Transformers.js's AutoModelForCTC loads (MODEL_FOR_CTC_MAPPING_NAMES, lines 32761-32769) whose
# automatic-speech-recognition pipeline throws `does not support model type` (its `_call`, lines 33712-33731)
CTC_PIPELINE_CANNOT = frozenset({"wavlm"})


def ctc_client_note(config: dict[str, Any]) -> str | None:
    """What export-hf says of a CTC head's folder whose model Transformers.js loads but does
    not transcribe with its pipeline, for config.json ``config``; None for the others."""
    architectures = config.get("architectures") or ()
    if config.get("model_type") not in CTC_PIPELINE_CANNOT or not any(str(a).endswith("ForCTC") for a in architectures):
        return None
    return (f"{TRANSFORMERS_JS} loads this folder (AutoModelForCTC) but its automatic-speech-recognition pipeline throws "
            f"`does not support model type '{config['model_type']}'` (lines 33712-33731 of dist/transformers.node.mjs): "
            "run the model and decode each frame's largest logit with the tokenizer (`tokenizer.decode`).")
