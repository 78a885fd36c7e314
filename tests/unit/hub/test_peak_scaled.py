"""Waveforms (and spectrograms) are compared relative to their scale: a tiny model's samples
(3e-6) are within any atol of every other waveform of that scale."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import torch

from fx2onnx.hub.shared.peak_scale import PEAK_SCALED_RULE, peak_scaled
from fx2onnx.hub.shared.verification import Tolerance, tolerance_for, verify_outputs

SAMPLE = 3e-6  # a tiny test vocoder's samples


def _scaling_model(path, factor: float):
    """An ONNX model giving ``waveform`` = ``values`` * ``factor``."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Mul", ["values", "factor"], ["waveform"])], "scale",
        [onnx.helper.make_tensor_value_info("values", onnx.TensorProto.FLOAT, ["batch", "n"])],
        [onnx.helper.make_tensor_value_info("waveform", onnx.TensorProto.FLOAT, ["batch", "n"])],
        [onnx.helper.make_tensor("factor", onnx.TensorProto.FLOAT, [], [factor])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


class _Tiny(torch.nn.Module):
    def forward(self, values: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(waveform=values * SAMPLE)


def _inputs(size: int) -> dict[str, torch.Tensor]:
    return {"values": torch.linspace(-1.0, 1.0, 7 + 4 * size).repeat(2 + size, 1)}


def test_a_tiny_wrong_waveform_fails_only_when_scaled(tmp_path):
    tolerance = tolerance_for(torch.float32)  # rtol 1e-3, atol 1e-4
    wrong = _scaling_model(tmp_path / "wrong.onnx", SAMPLE * 1.5)
    assert verify_outputs(wrong, _Tiny(), _inputs, "waveform", tolerance).passed  # the unscaled rule accepts it
    verdict = verify_outputs(wrong, _Tiny(), _inputs, "waveform", tolerance, scaled=True)
    assert not verdict.passed and verdict.worst_ratio > 100  # off by half the peak
    right = verify_outputs(_scaling_model(tmp_path / "right.onnx", SAMPLE), _Tiny(), _inputs, "waveform", tolerance,
                           scaled=True)
    assert right.passed and right.max_logit_difference < 1e-6


def test_peak_scaled_divides_by_the_peak_below_one_only():
    assert "min(1, its largest |transformers| value)" in PEAK_SCALED_RULE  # what export-hf says of the rule
    expected = torch.tensor([0.5, -2e-6, 1e-6])
    actual, reference = peak_scaled(expected.numpy() * 1.1, expected)
    np.testing.assert_allclose(reference.numpy(), [1.0, -4e-6, 2e-6])
    np.testing.assert_allclose(actual, [1.1, -4.4e-6, 2.2e-6])
    big = torch.tensor([3.0, -5.0])
    actual, reference = peak_scaled(big.numpy(), big)  # magnitudes of 1 and more: judged as they are
    assert reference.tolist() == [3.0, -5.0] and actual.tolist() == [3.0, -5.0]
    zeros = torch.zeros(3)  # an all-zero reference fails any waveform that is not
    actual, reference = peak_scaled(np.array([0.0, 1e-9, 0.0]), zeros)
    assert Tolerance(1e-3, 1e-4).worst_ratio(actual, reference.numpy()) > 1
    actual, reference = peak_scaled(np.zeros(3), zeros)
    assert Tolerance(1e-3, 1e-4).worst_ratio(actual, reference.numpy()) == 0
