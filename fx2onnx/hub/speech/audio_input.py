"""The audio input of a speech encoder-decoder's encoder, as the model and its feature
extractor give it: the model's main input (`input_features` or `input_values`), in the
layout its feature extractor writes: log-mel features mel bins first (Whisper:
(batch, mel, frames), always 3000 frames), frames first (Speech2Text, SeamlessM4T's
stacked 160-wide frames, Parakeet's encoder in Canary and Cohere ASR: (batch, frames,
width)), or the waveform itself (Moonshine, SpeechT5: (batch, samples)).

The examples are the folder's feature extractor's output for clips of noise of two
lengths (the frames, or samples, of a longer clip are what a dynamic dim must follow), in
batches of BATCH and BATCH + 1 clips, the last one shorter: the extractor pads it, and
returns the mask of the padding where the model reads one (audio_mask.py). A folder
without a feature extractor gets random features of the shape its config gives
(pipeline_tasks.audio_inputs).
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fx2onnx.hub.shared.folder_files import processor_file_settings
from fx2onnx.hub.speech.audio_mask import FRAMES, MASK, SAMPLES, takes_mask

AUDIO_INPUTS = ("input_features", "input_values")
FEATURE_EXTRACTOR_FILE, PROCESSOR_FILE = "preprocessor_config.json", "processor_config.json"
BATCH = 2
# clip lengths in seconds of the two example sizes: frames of 10 ms and samples no other dim shares
CLIP_SECONDS = (1.0, 1.55)
# the last clip of an example batch, as a share of the others: a padded row
SHORTER_CLIP = 0.7


def audio_input_name(model: torch.nn.Module) -> str | None:
    """The audio input of the model's encoder (its main input, or the model's:
    SpeechEncoderDecoderModel's own is `inputs`), None when it reads something else (text)."""
    encoder = model.get_encoder() if hasattr(model, "get_encoder") else None
    for name in (getattr(encoder, "main_input_name", None), getattr(model, "main_input_name", None)):
        if name in AUDIO_INPUTS:
            return name
    return None


@dataclass(frozen=True)
class AudioLayout:
    """The model's audio input: its name and the axis of its time (None: a fixed length)."""

    name: str
    time_axis: int | None

    def dim_roles(self) -> dict[str, dict[int, str]]:
        """The names of the input's batch and time dims (dim_roles)."""
        from fx2onnx.hub.shared.dim_roles import BATCH as BATCH_DIM

        roles = {0: BATCH_DIM}
        if self.time_axis is None:
            return {self.name: roles}
        time = SAMPLES if self.name == "input_values" else FRAMES
        # the mask of a padded batch follows the input's time (audio_mask.py)
        return {self.name: {**roles, self.time_axis: time}, MASK: {0: BATCH_DIM, 1: time}}


def feature_extractor_settings(folder: Path) -> dict[str, Any] | None:
    """The folder's feature extractor settings: `preprocessor_config.json`, or the
    `feature_extractor` part of `processor_config.json` (transformers 5 saves a processor so,
    alone); None without either."""
    return processor_file_settings(folder, "feature_extractor")


def feature_extractor(folder: Path) -> Any:
    """The folder's feature extractor, None when it has none or it needs a library not
    installed (the examples then follow the config, and a warning says why)."""
    if feature_extractor_settings(folder) is None:
        return None
    from transformers import AutoFeatureExtractor

    try:
        return AutoFeatureExtractor.from_pretrained(folder)
    except ImportError as error:  # librosa, torchaudio: the shapes are then the config's
        warnings.warn(f"The folder's feature extractor cannot be loaded ({error}); the speech encoder's example "
                      "inputs follow the model's config instead.", stacklevel=2)
        return None


def extractor_gives_mask(folder: Path) -> bool:
    """Whether the folder's feature extractor returns an attention mask (False without one)."""
    extractor = feature_extractor(folder)
    if extractor is None:
        return False
    rate = int(getattr(extractor, "sampling_rate", 16000) or 16000)
    return MASK in extractor([np.zeros(rate // 10, dtype=np.float32)], sampling_rate=rate, return_tensors="np")


def reads_mask(folder: Path, module: torch.nn.Module) -> bool:
    """Whether ``module`` (a model, or an encoder-decoder's encoder) is given the mask the
    folder's feature extractor returns."""
    return takes_mask(module) and extractor_gives_mask(folder)


def _padded(extractor: Any) -> dict[str, Any]:
    """The argument that pads a batch of clips to its longest, for an extractor that pads
    none by default (Speech2Text's); an extractor that pads to a length of its own
    (Whisper's 30 s) keeps it."""
    padding = inspect.signature(extractor.__call__).parameters.get("padding")
    return {"padding": True} if padding is not None and padding.default is False else {}


def _extracted(extractor: Any, name: str, batch: int, seconds: float, seed: int, with_mask: bool) -> dict[str, torch.Tensor]:
    rate = int(getattr(extractor, "sampling_rate", 16000) or 16000)
    generator = np.random.default_rng(seed)
    lengths = [seconds] * (batch - 1) + [seconds * SHORTER_CLIP]
    clips = [(0.1 * generator.standard_normal(int(rate * length))).astype(np.float32) for length in lengths]
    features = extractor(clips, sampling_rate=rate, return_tensors="pt", **_padded(extractor))
    if name not in features:
        raise ValueError(
            f"The folder's feature extractor ({type(extractor).__name__}) gives {', '.join(features)} but the model reads "
            f"{name}: give the folder the feature extractor the model was trained with."
        )
    inputs = {name: features[name].float()}
    if with_mask and MASK in features:
        inputs[MASK] = features[MASK].long()
    return inputs


def speech_examples(
    folder: Path, config: Any, model: torch.nn.Module, size: int, with_mask: bool = False,
) -> dict[str, torch.Tensor]:
    """The encoder's example input of ``size`` 0 or 1: BATCH + size clips of
    CLIP_SECONDS[size] seconds (the last one shorter), as the folder's feature extractor
    gives them; ``with_mask``: with the mask it returns."""
    name = audio_input_name(model)
    if name is None:
        raise ValueError(f"{type(model).__name__} reads {getattr(model, 'main_input_name', None)}, not audio")
    extractor = feature_extractor(folder)
    if extractor is None:
        from fx2onnx.hub.pipeline_tasks import audio_inputs

        inputs = audio_inputs(config, model, size)
    else:
        inputs = _extracted(extractor, name, BATCH + size, CLIP_SECONDS[size], size, with_mask)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return {key: value.to(dtype) if value.is_floating_point() else value for key, value in inputs.items()}


def audio_layout(folder: Path, config: Any, model: torch.nn.Module) -> AudioLayout:
    """The model's audio input and the axis along which its two example sizes differ (its
    time; None when the feature extractor pads every clip to one length, as Whisper's)."""
    name = audio_input_name(model)
    shapes = [speech_examples(folder, config, model, size)[str(name)].shape for size in (0, 1)]
    changed = [axis for axis in range(1, len(shapes[0])) if shapes[0][axis] != shapes[1][axis]]
    return AudioLayout(str(audio_input_name(model)), changed[0] if changed else None)
