"""A SpeechT5 text-to-speech folder run as Transformers.js's `generate_speech` runs it (the
encoder, the merged decoder step by step until a `prob` reaches the threshold or the
maximum length, the vocoder on the concatenated spectra), against transformers'
`generate_speech` with the same speaker embedding, without the prenet's dropout
(speecht5_tts.py): the spectrogram (the ONNX spectra through the model's postnet) and
the waveform, each text alone (Transformers.js generates one text at a time)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fx2onnx.hub.shared.merged_decoder import USE_CACHE_BRANCH
from fx2onnx.hub.shared.peak_scale import peak_scaled
from fx2onnx.hub.shared.verification import Tolerance, Verification, cpu_session, empty_cache, run_session, verdict_of
from fx2onnx.hub.speech.speecht5_tts import first_spectrum, without_prenet_dropout

__all__ = ["THRESHOLD", "MAXLENRATIO", "onnx_speech", "verify_speecht5"]

# transformers' and Transformers.js's defaults (minlenratio 0: no minimum)
THRESHOLD, MAXLENRATIO = 0.5, 20.0


@contextlib.contextmanager
def _sessions(encoder_path: Path, decoder_path: Path, vocoder_path: Path) -> Iterator[tuple[Any, Any, Any]]:
    """The CPU sessions of the folder's encoder, merged decoder and vocoder."""
    with cpu_session(encoder_path) as encoder, cpu_session(decoder_path) as decoder, cpu_session(vocoder_path) as vocoder:
        yield encoder, decoder, vocoder


def onnx_speech(encoder_path: Path, decoder_path: Path, vocoder_path: Path, input_ids: np.ndarray,
                speaker_embeddings: np.ndarray, reduction_factor: int, num_mel_bins: int, maxlenratio: float = MAXLENRATIO,
                threshold: float = THRESHOLD) -> tuple[np.ndarray, np.ndarray]:
    """The spectra (frames, mel bins) and the waveform the folder's models give one text (batch 1)."""
    with _sessions(encoder_path, decoder_path, vocoder_path) as sessions:
        return _speech(*sessions, input_ids, speaker_embeddings, reduction_factor, num_mel_bins, maxlenratio, threshold)


def _speech(encoder: Any, decoder: Any, vocoder: Any, input_ids: np.ndarray, speaker_embeddings: np.ndarray,
            reduction_factor: int, num_mel_bins: int, maxlenratio: float = MAXLENRATIO,
            threshold: float = THRESHOLD) -> tuple[np.ndarray, np.ndarray]:
    """:func:`onnx_speech` on the folder's open sessions."""
    encoded = run_session(encoder, {"input_ids": input_ids})
    hidden, mask = encoded["encoder_outputs"], encoded["encoder_attention_mask"]
    maxlen = int(hidden.shape[1] / reduction_factor * maxlenratio)
    feeds = {"output_sequence": first_spectrum(num_mel_bins, hidden.shape[0]).numpy(), "speaker_embeddings": speaker_embeddings,
             "encoder_hidden_states": hidden, "encoder_attention_mask": mask, **empty_cache(decoder, hidden.shape[0])}
    spectra, step, with_cache = [], 0, False
    while True:
        step += 1
        feeds[USE_CACHE_BRANCH] = np.array([with_cache])
        outputs = run_session(decoder, feeds)
        spectra.append(outputs["spectrum"])
        feeds["output_sequence"] = outputs["output_sequence_out"]
        for name, value in outputs.items():
            if name.startswith("present."):
                past = name.replace("present.", "past_key_values.", 1)
                # the cross-attention cache is the first step's (Transformers.js keeps it)
                if ".encoder." not in name or not with_cache:
                    feeds[past] = value
        with_cache = True
        if (outputs["prob"] >= threshold).any() or step >= maxlen:
            break
    spectrogram = np.concatenate(spectra)
    waveform = run_session(vocoder, {"spectrogram": spectrogram})["waveform"]
    return spectrogram, waveform


def verify_speecht5(
    encoder_path: Path, decoder_path: Path, vocoder_path: Path, model: nn.Module, vocoder: nn.Module,
    texts: list[torch.Tensor], speaker_embeddings: torch.Tensor, tolerance: Tolerance,
) -> Verification:
    """The folder against transformers' `generate_speech` (no prenet dropout) on each of ``texts``
    (token ids, (1, tokens)): equal frame counts, spectrograms and waveforms within ``tolerance``,
    each divided by min(1, its largest |transformers| value) (peak_scale.py)."""
    pairs = []
    with _sessions(encoder_path, decoder_path, vocoder_path) as sessions:  # opened once for every text
        for input_ids in texts:
            with torch.no_grad(), without_prenet_dropout(model):
                expected = model.generate_speech(input_ids, speaker_embeddings)
                expected_waveform = vocoder(expected)
                spectra, waveform = _speech(
                    *sessions, input_ids.numpy(), speaker_embeddings.numpy(), int(model.config.reduction_factor),
                    int(model.config.num_mel_bins))
                spectrogram = model.speech_decoder_postnet.postnet(torch.from_numpy(spectra).unsqueeze(0)).squeeze(0)
            if tuple(spectrogram.shape) != tuple(expected.shape):
                failure = (f"the spectrogram has {spectrogram.shape[0]} frames where transformers' has {expected.shape[0]} "
                           f"({input_ids.shape[1]} tokens)")
                return Verification.failed(failure, tolerance)
            # a tiny vocoder's samples (3e-6) are within any atol of every waveform of their scale
            pairs += [peak_scaled(spectrogram.numpy(), expected),
                      peak_scaled(waveform.reshape(-1), expected_waveform.reshape(-1))]
    return verdict_of(pairs, tolerance)
