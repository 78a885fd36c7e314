"""SARIF report files of real exports: where they go, what they hold, how big they are.

Every report is checked with ``validate_sarif`` (official schema and semantic checks) and
read back through sarif-tools, the real consumer, for the levels and rule ids.
"""

from __future__ import annotations

import collections
import json
import logging
import os
from pathlib import Path

import pytest
import torch

import fx2onnx
from sarif_checks import sarif_tools_csv, sarif_tools_summary, validate_sarif


@torch.library.custom_op("fx2onnx_report_test::unsupported", mutates_args=())
def unsupported_op(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@unsupported_op.register_fake
def _(x):
    return torch.empty_like(x)


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Failing(torch.nn.Module):
    def forward(self, x):
        return unsupported_op(x).relu()


def options(verbosity: int = logging.INFO, **kwargs) -> fx2onnx.ExportOptions:
    kwargs.setdefault("failure_report_path", None)
    return fx2onnx.ExportOptions(diagnostic_options=fx2onnx.DiagnosticOptions(verbosity_level=verbosity), **kwargs)


def counts(log: dict) -> collections.Counter:
    return collections.Counter((r["level"], r["ruleId"]) for r in log["runs"][0]["results"])


def csv_counts(path: Path) -> collections.Counter:
    return collections.Counter((row["Severity"], row["Code"]) for row in sarif_tools_csv(path))


# -- save_diagnostics ------------------------------------------------------------------------


def test_save_diagnostics_writes_a_valid_report_of_a_successful_export(tmp_path):
    program = fx2onnx.dynamo_export(Mlp(), torch.randn(3, 4), export_options=options())
    path = tmp_path / "mlp.sarif"
    program.save_diagnostics(path)
    log = validate_sarif(path)
    # the summary note, and one level-none record per dispatch decision (linear, relu, linear)
    assert counts(log) == {("note", "FXE0018"): 1, ("none", "FXE0014"): 3}
    assert log["runs"][0]["invocations"][0]["executionSuccessful"] is True
    assert csv_counts(path) == {("note", "FXE0018"): 1, ("none", "FXE0014"): 3}
    summary = sarif_tools_summary(path)
    assert "error: 0" in summary and "warning: 0" in summary and "note: 1" in summary


@pytest.mark.parametrize("name", ["report.json", "report.txt", "report", ".sarif", "report.sarif.gz"])
def test_save_diagnostics_requires_a_sarif_file_name(tmp_path, name):
    program = fx2onnx.dynamo_export(Mlp(), torch.randn(3, 4), export_options=options())
    with pytest.raises(ValueError, match=r"\.sarif"):
        program.save_diagnostics(tmp_path / name)
    assert not list(tmp_path.iterdir())


# -- the report of a failed export -----------------------------------------------------------


def test_failure_report_goes_to_the_current_directory_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(fx2onnx.OnnxExporterError) as info:
        fx2onnx.dynamo_export(Failing(), torch.randn(2, 3))
    report = tmp_path / "report_dynamo_export.sarif"
    assert report.is_file()
    assert str(report) in str(info.value)
    log = validate_sarif(report)
    assert counts(log) == {("error", "FXE0012"): 1, ("note", "FXE0018"): 1}
    assert log["runs"][0]["invocations"][0]["executionSuccessful"] is False
    assert csv_counts(report) == {("error", "FXE0012"): 1, ("note", "FXE0018"): 1}
    # The failed program still saves its diagnostics, identical to the automatic report.
    info.value.onnx_program.save_diagnostics(tmp_path / "again.sarif")
    assert json.loads((tmp_path / "again.sarif").read_text()) == log


def test_failure_report_path_option_moves_the_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "reports" / "failed.sarif"
    target.parent.mkdir()
    with pytest.raises(fx2onnx.OnnxExporterError) as info:
        fx2onnx.dynamo_export(Failing(), torch.randn(2, 3), export_options=fx2onnx.ExportOptions(failure_report_path=target))
    assert target.is_file() and not (tmp_path / "report_dynamo_export.sarif").exists()
    assert str(target) in str(info.value)
    validate_sarif(target)


def test_failure_report_path_none_writes_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(fx2onnx.OnnxExporterError) as info:
        fx2onnx.dynamo_export(Failing(), torch.randn(2, 3), export_options=fx2onnx.ExportOptions(failure_report_path=None))
    assert not list(tmp_path.iterdir())
    assert "SARIF report" not in str(info.value)
    assert "fx2onnx_report_test::unsupported" in str(info.value)


def test_an_unwritable_failure_report_path_is_explained(tmp_path):
    with pytest.raises(fx2onnx.OnnxExporterError) as info:
        fx2onnx.dynamo_export(
            Failing(), torch.randn(2, 3), export_options=fx2onnx.ExportOptions(failure_report_path=tmp_path / "r.json")
        )
    assert "could not be written" in str(info.value)
    assert not list(tmp_path.iterdir())


# -- verbosity -------------------------------------------------------------------------------


def test_verbosity_changes_what_is_recorded(tmp_path):
    reports = {}
    for verbosity in (logging.INFO, logging.DEBUG):
        program = fx2onnx.dynamo_export(Mlp(), torch.randn(3, 4), export_options=options(verbosity))
        reports[verbosity] = tmp_path / f"mlp_{logging.getLevelName(verbosity)}.sarif"
        program.save_diagnostics(reports[verbosity])
    info, debug = (validate_sarif(reports[v]) for v in (logging.INFO, logging.DEBUG))

    # Default: warnings, errors, one summary note and the dispatch decisions (level none,
    # without the candidates' log).
    assert counts(info) == {("note", "FXE0018"): 1, ("none", "FXE0014"): 3}
    # Verbose: a result per pass, for the graph, per FX node and per dispatch decision.
    levels = counts(debug)
    assert levels[("note", "FXE0018")] == 1
    assert levels[("none", "FXE0007")] == 1
    assert levels[("none", "FXE0010")] >= 2
    call_functions = 3  # linear, relu, linear (the MLP's aten operators)
    assert levels[("none", "FXE0014")] >= call_functions
    assert levels[("none", "FXE0008")] >= call_functions + 2  # + input and output nodes
    node_logs = [
        r["message"].get("markdown", "")
        for r in debug["runs"][0]["results"]
        if r["ruleId"] == "FXE0008" and "call_function" in r["message"]["text"]
    ]
    assert node_logs and all("FX node:" in text and "ONNX function:" in text for text in node_logs)
    assert csv_counts(reports[logging.DEBUG])[("none", "FXE0008")] == levels[("none", "FXE0008")]
    assert reports[logging.DEBUG].stat().st_size > reports[logging.INFO].stat().st_size


def test_warnings_and_errors_are_kept_below_the_default_verbosity(tmp_path):
    """logging.ERROR verbosity drops the summary note but never a problem."""
    report = tmp_path / "quiet.sarif"
    with pytest.raises(fx2onnx.OnnxExporterError):
        fx2onnx.dynamo_export(Failing(), torch.randn(2, 3), export_options=options(logging.ERROR, failure_report_path=report))
    assert counts(validate_sarif(report)) == {("error", "FXE0012"): 1}


# -- a real model: GPT-2 ---------------------------------------------------------------------


@pytest.mark.slow
def test_gpt2_report_is_small_at_default_verbosity(tmp_path, record_property):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=1000, n_positions=64, use_cache=False
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    input_ids = torch.randint(0, 1000, (1, 8))
    sizes = {}
    for verbosity in (logging.INFO, logging.DEBUG):
        program = fx2onnx.dynamo_export(model, input_ids, export_options=options(verbosity))
        path = tmp_path / f"gpt2_{logging.getLevelName(verbosity)}.sarif"
        program.save_diagnostics(path)
        validate_sarif(path)
        sizes[logging.getLevelName(verbosity)] = path.stat().st_size
        assert not program.diagnostic_context.errors()
    record_property("sarif_bytes", sizes)
    assert sizes["INFO"] < 200_000, sizes
    assert sizes["DEBUG"] > sizes["INFO"]
    rows = csv_counts(tmp_path / "gpt2_INFO.sarif")
    assert rows[("note", "FXE0018")] == 1
    assert set(rows) <= {("note", "FXE0018"), ("none", "FXE0014"), ("warning", "FXE0014"), ("warning", "FXE0016")}
    summary = sarif_tools_summary(tmp_path / "gpt2_DEBUG.sarif")
    assert "FXE0008" in summary and "FXE0014" in summary and "FXE0007" in summary
