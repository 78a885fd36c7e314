"""The config files ONNX Runtime GenAI reads beside a Whisper folder's two models.

- `genai_config.json`: `model.type` "whisper", an `encoder` section (`audio_features` ->
  `encoder_hidden_states`, `cross_present_key_names`/`cross_present_value_names`) and a
  `decoder` section (`input_ids`, `past_key_names`/`past_value_names` of the
  self-attention, `cross_past_key_names`/`cross_past_value_names` -> `logits`,
  `present_key_names`/`present_value_names`): the keys src/config.cpp parses. Its `search`
  section carries the generation config's beam search (`num_beams`, `length_penalty`,
  `early_stopping`): the runtime runs beam search for Whisper with this decoder as it is
  (it repeats the cross caches per beam and reorders the self-attention caches itself; no
  `cache_indirection` input). It scores a finished beam by its sum of log-probabilities
  divided by the whole sequence's length, prompt included and end of text excluded, to the
  power `length_penalty`, where transformers divides by the generated length, end of text
  included: the two searches are the same only with `length_penalty` 0.
- `audio_processor_config.json`: the runtime's log-mel pipeline (onnxruntime-extensions'
  `AudioDecoder`, `STFTNorm`, `LogMelSpectrum`) with the parameters of the source
  folder's `WhisperFeatureExtractor` (`preprocessor_config.json`): FFT size, hop length,
  mel bins, chunk length, sampling rate. The runtime computes its mel filters for 16 kHz
  audio and the encoder on 3000 frames: a feature extractor that differs is refused
  with the reason, rather than written into a folder that would transcribe other features.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fx2onnx.hub.shared.genai_config import search_options, session_options, token_ids
from fx2onnx.hub.shared.json_files import read_json

# the models' input and output names (key and value templates of each cache), as the config gives them
AUDIO_FEATURES, HIDDEN_STATES = "audio_features", "encoder_hidden_states"
CROSS_PRESENT = ("present_key_cross_%d", "present_value_cross_%d")
CROSS_PAST = ("past_key_cross_%d", "past_value_cross_%d")
SELF_PAST = ("past_key_self_%d", "past_value_self_%d")
SELF_PRESENT = ("present_key_self_%d", "present_value_self_%d")
# onnxruntime-extensions' LogMelSpectrum builds its mel filters for this rate, whatever the audio's
RUNTIME_SAMPLING_RATE = 16000
FEATURE_EXTRACTOR_FILE = "preprocessor_config.json"


def whisper_genai_config(
    config: Any, generation_config: Any, encoder_file: str, decoder_file: str, heads: int, head_size: int, layers: int
) -> dict[str, Any]:
    """genai_config.json of a Whisper folder: the two files and their names (whisper_genai.py's)."""
    context = int(config.max_target_positions)
    sizes = {"head_size": head_size, "hidden_size": int(config.d_model), "num_attention_heads": heads}
    encoder_sizes = sizes | {"num_attention_heads": int(config.encoder_attention_heads),
                             "num_hidden_layers": int(config.encoder_layers)}
    return {
        "model": {
            **token_ids(config, generation_config),
            "context_length": context,
            "decoder": {
                "session_options": session_options(),
                "filename": decoder_file,
                **sizes,
                "inputs": {
                    "input_ids": "input_ids",
                    "past_key_names": SELF_PAST[0], "past_value_names": SELF_PAST[1],
                    "cross_past_key_names": CROSS_PAST[0], "cross_past_value_names": CROSS_PAST[1],
                },
                "outputs": {"logits": "logits", "present_key_names": SELF_PRESENT[0], "present_value_names": SELF_PRESENT[1]},
                "num_hidden_layers": layers,
                "num_key_value_heads": heads,
            },
            "encoder": {
                "session_options": session_options(),
                "filename": encoder_file,
                **encoder_sizes,
                "inputs": {"audio_features": AUDIO_FEATURES},
                "outputs": {
                    "encoder_hidden_states": HIDDEN_STATES,
                    "cross_present_key_names": CROSS_PRESENT[0], "cross_present_value_names": CROSS_PRESENT[1],
                },
            },
            "type": "whisper",
            "vocab_size": int(config.vocab_size),
        },
        # the cache is returned as new tensors: the runtime gives past and present apart
        "search": search_options(context, False) | beam_search_options(generation_config),
    }


def beam_search_options(generation_config: Any) -> dict[str, Any]:
    """The generation config's beam search as the runtime's `search` keys (greedy when unset).
    transformers' `early_stopping="never"` has no runtime equivalent: written as False, the
    runtime's (and transformers') heuristic stop."""
    def value(name: str, default: Any) -> Any:
        found = getattr(generation_config, name, None) if generation_config is not None else None
        return default if found is None else found

    return {"num_beams": int(value("num_beams", 1)), "length_penalty": float(value("length_penalty", 1.0)),
            "early_stopping": value("early_stopping", False) is True}


def beam_search_note(generation_config: Any) -> str | None:
    """What the folder's beam search does unlike transformers' `generate` (None: the same or greedy)."""
    search = beam_search_options(generation_config)
    if search["num_beams"] == 1 or search["length_penalty"] == 0.0:
        return None
    return (f"beam search: genai_config.json has the generation config's num_beams {search['num_beams']} and "
            f"length_penalty {search['length_penalty']}; ONNX Runtime GenAI divides a finished beam's log-probability by "
            "the whole sequence's length (prompt included) where transformers divides by the generated length, so they "
            "may rank beams differently. length_penalty 0 (the sum of log-probabilities) searches as generate does.")


def _feature_extractor(folder: Path) -> dict[str, Any]:
    path = folder / FEATURE_EXTRACTOR_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"'{folder}' has no {FEATURE_EXTRACTOR_FILE}: ONNX Runtime GenAI computes Whisper's log-mel features itself, "
            "with the feature extractor's parameters. Save the model's WhisperFeatureExtractor beside it "
            "(feature_extractor.save_pretrained(folder)), or export with --runtime standard (Optimum's layout, no "
            "audio processing in the folder)."
        )
    return read_json(path)


def audio_processor_config(folder: Path, mel_bins: int, frames: int) -> dict[str, Any]:
    """audio_processor_config.json from the WhisperFeatureExtractor saved in ``folder``,
    for an encoder of ``mel_bins`` x ``frames`` features."""
    extractor = _feature_extractor(folder)
    n_fft, hop, chunk = int(extractor.get("n_fft", 400)), int(extractor.get("hop_length", 160)), int(extractor.get("chunk_length", 30))
    rate, bins = int(extractor.get("sampling_rate", RUNTIME_SAMPLING_RATE)), int(extractor.get("feature_size", mel_bins))
    problems = []
    if rate != RUNTIME_SAMPLING_RATE:
        problems.append(f"its sampling_rate is {rate} Hz where the runtime's mel filters are for {RUNTIME_SAMPLING_RATE} Hz")
    if bins != mel_bins:
        problems.append(f"its feature_size is {bins} where the model takes {mel_bins} mel bins")
    if chunk * rate // hop != frames:
        problems.append(f"its {chunk} s chunks give {chunk * rate // hop} frames where the runtime runs the encoder on {frames}")
    if problems:
        raise ValueError(
            f"ONNX Runtime GenAI cannot compute this Whisper model's features ({FEATURE_EXTRACTOR_FILE}): "
            f"{'; '.join(problems)}. Export with --runtime standard (Optimum's layout) and compute the features "
            "with transformers' WhisperFeatureExtractor."
        )
    return {
        "feature_extraction": {
            "sequence": [
                {"operation": {"name": "audio_decoder", "type": "AudioDecoder", "attrs": {"target_sample_rate": rate}}},
                {"operation": {"name": "STFT", "type": "STFTNorm",
                               "attrs": {"n_fft": n_fft, "frame_length": n_fft, "hop_length": hop}}},
                {"operation": {"name": "log_mel_spectrogram", "type": "LogMelSpectrum",
                               "attrs": {"chunk_size": chunk, "hop_length": hop, "n_fft": n_fft, "n_mel": bins}}},
            ]
        }
    }
