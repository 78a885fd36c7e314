"""A model exported in training mode gets a note (SARIF and a Python warning) naming its
dropout and batch norms and saying how to export for inference; what it exports stays
what the model does."""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

import fx2onnx
from conftest import make_options


def _net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Dropout(0.5), nn.Linear(64, 2))


def _export(model: nn.Module, x: torch.Tensor, tmp_path) -> tuple[fx2onnx.ONNXProgram, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = fx2onnx.dynamo_export(model, x, export_options=make_options(tmp_path))
    return program, [str(w.message) for w in caught if issubclass(w.category, fx2onnx.ExportWarning)]


def test_training_mode_is_a_note_that_says_what_and_how(tmp_path):
    program, texts = _export(_net().train(), torch.randn(2, 3, 6, 6), tmp_path)
    (note,) = [d for d in program.diagnostics if d.rule.id == "FXE0026"]
    assert note.level.name == "NOTE"
    assert note.message.startswith("Sequential was exported in training mode")
    assert "the dropout `4` (Dropout) drops random elements on every run" in note.message
    assert "the batch norm `1` (BatchNorm2d) normalizes with each batch's statistics" in note.message
    assert "call model.eval() before exporting" in note.message
    assert note.message in texts
    program.save_diagnostics(tmp_path / "r.sarif")
    assert "FXE0026" in (tmp_path / "r.sarif").read_text()


def test_training_mode_batch_norm_exports_batch_statistics(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    x = torch.randn(2, 3, 6, 6)
    program, texts = _export(copy.deepcopy(model), x, tmp_path)
    assert any("training mode" in t for t in texts)
    with torch.no_grad():
        expected = model(x)  # batch statistics, as exported
    torch.testing.assert_close(program(x), expected, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        assert not torch.allclose(model.eval()(x), expected, atol=1e-3)  # the note is about a real difference


def test_inference_mode_and_batch_statistics_by_design_get_no_note(tmp_path):
    program, texts = _export(_net().eval(), torch.randn(2, 3, 6, 6), tmp_path)
    assert not [d for d in program.diagnostics if d.rule.id == "FXE0026"]
    assert not any("training mode" in t for t in texts)
    no_running_stats = nn.Sequential(nn.BatchNorm1d(3, track_running_stats=False)).eval()
    program, _ = _export(no_running_stats, torch.randn(4, 3), tmp_path)
    assert not [d for d in program.diagnostics if d.rule.id == "FXE0026"]
