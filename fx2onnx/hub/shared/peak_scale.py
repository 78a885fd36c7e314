"""Comparing an output that may be tiny (a waveform, a spectrogram) relative to its scale:
a tiny test vocoder's samples (3e-6) are within a tolerance's atol (1e-4) of any waveform of
that scale, so the atol alone would accept a wrong one."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["PEAK_SCALED_RULE", "peak_scaled"]

# What a comparison of an output that may be tiny (a waveform, a spectrogram) says of its rule.
PEAK_SCALED_RULE = ("each compared divided by min(1, its largest |transformers| value), so that the tolerance's "
                    "atol shrinks with an output whose values are below 1")


def peak_scaled(actual: np.ndarray, expected: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """``actual`` and ``expected`` divided by ``min(1, max |expected|)``: judged by a
    :class:`Tolerance` they pass when ``|onnx - torch| <= atol * min(1, peak) + rtol * |torch|``.
    A tiny model's waveform (samples of 3e-6) is otherwise within any atol of every other
    waveform of its scale; an output of magnitude 1 and more is judged as it is. An all-zero
    ``expected`` (peak floored at float32's smallest normal) fails any ``actual`` that is not."""
    peak = float(expected.abs().max()) if expected.numel() else 1.0
    scale = min(1.0, max(peak, float(np.finfo(np.float32).tiny)))
    return actual.astype(np.float64) / scale, expected.double() / scale
