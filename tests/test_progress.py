"""Export progress on a terminal: stages and translated nodes, through tqdm."""

from __future__ import annotations

import io
import sys

import pytest
import torch

import fx2onnx
from conftest import TerminalStream, progress_counters


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x).softmax(-1)


def _export_with_stderr(monkeypatch, stream, progress):
    monkeypatch.setattr(sys, "stderr", stream)
    options = fx2onnx.ExportOptions(progress=progress, failure_report_path=None)
    return fx2onnx.dynamo_export(_Model(), torch.randn(3, 4), export_options=options)


def test_terminal_shows_stages_and_translated_nodes(monkeypatch):
    terminal = TerminalStream()
    program = _export_with_stderr(monkeypatch, terminal, True)
    shown = terminal.getvalue()
    assert "Exporting _Model" in shown
    for stage in ("capture", "translation"):
        assert stage in shown
    # the node counter reaches the number of FX nodes translated (placeholders, calls,
    # module-call bodies and outputs)
    totals = [total for _, total in progress_counters(shown)]
    assert totals and max(totals) >= 10
    assert program.model_proto.graph.node


@pytest.mark.parametrize("progress, stream", [(False, TerminalStream()), (True, io.StringIO()), (None, io.StringIO())])
def test_nothing_is_shown_when_switched_off_or_not_a_terminal(monkeypatch, progress, stream):
    _export_with_stderr(monkeypatch, stream, progress)
    assert stream.getvalue() == ""


def test_short_exports_show_nothing_by_default(monkeypatch):
    terminal = TerminalStream()
    _export_with_stderr(monkeypatch, terminal, None)  # well under the few-seconds delay
    assert terminal.getvalue() == ""
