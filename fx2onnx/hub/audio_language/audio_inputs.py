"""The audio encoder's example inputs: random features (or waveform samples) of the sizes the
model takes, with masks of ones. Encoders differ in the layout of their features (mel bins
first, Whisper's, or frames first) and in the lengths they accept (Whisper's encoders take
only `2 * max_source_positions` frames), and nothing in transformers states either; so the
sizes are those of the first candidate on which the model's own `get_audio_features` runs:
the bins from the audio config or the folder's feature extractor configuration
(`preprocessor_config.json`), the lengths from the audio config, then a few common ones."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from fx2onnx.hub.audio_language.hooks import PROMPT, AudioHooks, audio_token_ids
from fx2onnx.hub.shared.json_files import read_json_if_present

_BIN_KEYS = ("num_mel_bins", "input_dim", "feature_size", "n_mels", "num_mel_filters")
_FRAMES = (3000, 200)  # Whisper's 30 s of frames, then a short clip
_SAMPLES = 16000  # one second of a waveform at 16 kHz
_HOP = 160  # samples per frame of a padding mask over raw audio (10 ms at 16 kHz)


def _extractor_settings(folder: Path) -> dict[str, Any]:
    return read_json_if_present(folder / "preprocessor_config.json", {})


def _audio_configs(config: Any) -> list[Any]:
    """The sub-configs beside the text model's (the audio encoder's: `audio_config`, Granite
    Speech's `encoder_config`)."""
    return [value for name, value in vars(config).items() if name != "text_config" and hasattr(value, "to_dict")]


def _bins(config: Any, settings: dict[str, Any]) -> list[int]:
    found = [getattr(audio, key, None) for audio in _audio_configs(config) for key in _BIN_KEYS]
    found += [settings.get(key) for key in _BIN_KEYS]
    return list(dict.fromkeys(int(value) for value in found if isinstance(value, int) and value > 0))


def _frames(config: Any) -> list[int]:
    positions = [getattr(audio, "max_source_positions", None) for audio in _audio_configs(config)]
    whisper = [2 * int(value) for value in positions if isinstance(value, int)]
    return list(dict.fromkeys(whisper + list(_FRAMES)))


def candidates(config: Any, hooks: AudioHooks, folder: Path, batch: int, seed: int) -> Iterator[dict[str, torch.Tensor]]:
    """Audio inputs of each candidate size for ``hooks``' encoder, ``batch`` clips."""
    settings = _extractor_settings(folder)
    generator = torch.Generator().manual_seed(seed)
    hop = int(settings.get("hop_length", _HOP))
    if "input_values" in hooks.inputs:
        samples = int(settings.get("sampling_rate", _SAMPLES))
        for shape in ((batch, samples), (batch, 1, samples)):
            values = torch.randn(*shape, generator=generator) * 0.1
            yield _with_masks(hooks, {"input_values": values}, samples, samples)
        return
    for frames in _frames(config):
        for bins in _bins(config, settings):
            for shape in ((batch, bins, frames), (batch, frames, bins)):
                features = torch.randn(*shape, generator=generator)
                yield _with_masks(hooks, {"input_features": features}, frames, frames * hop)


def _with_masks(hooks: AudioHooks, audio: dict[str, torch.Tensor], frames: int, samples: int) -> dict[str, torch.Tensor]:
    batch = next(iter(audio.values())).shape[0]
    for name in ("input_features_mask", "feature_attention_mask"):
        if name in hooks.inputs:
            audio[name] = torch.ones(batch, frames, dtype=torch.int64)
    if "padding_mask" in hooks.inputs:
        audio["padding_mask"] = torch.ones(batch, samples, dtype=torch.int64)
    return audio


def audio_inputs(model: torch.nn.Module, hooks: AudioHooks, folder: Path, batch: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """The first candidate inputs on which ``model``'s `get_audio_features` runs and gives
    features; a clear error naming the sizes tried when none does."""
    tried = []
    for audio in candidates(model.config, hooks, folder, batch, seed):
        try:
            if PROMPT in hooks.inputs:
                audio[PROMPT] = audio_token_ids(model, hooks, audio)
            with torch.no_grad():
                rows = hooks.features(model, audio).shape[0]
        except Exception as error:  # noqa: BLE001 - the next size is tried; every failure is reported
            tried.append(f"{_sizes(audio)}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
            continue
        if rows:
            return audio
        tried.append(f"{_sizes(audio)}: no features")
    raise NotImplementedError(
        f"{type(model).__name__}'s get_audio_features ran on none of the audio input sizes tried (from its audio "
        f"config and preprocessor_config.json): {'; '.join(tried) or 'none (no mel bins in either)'}. Nothing was written."
    )


def _sizes(audio: dict[str, torch.Tensor]) -> str:
    return ", ".join(f"{name} {list(value.shape)}" for name, value in audio.items())
