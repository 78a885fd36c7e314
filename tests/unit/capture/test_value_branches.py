"""A capture that fails on a Python branch over tensor values names the model's line in its
hint (and so in the SARIF report), and a value the model holds (a buffer) is not blamed on
the inputs."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch

import fx2onnx
from fx2onnx.capture.value_branches import value_branch
from sarif_checks import validate_sarif


def line_of(marker: str) -> int:
    for number, line in enumerate(inspect.getsource(inspect.getmodule(line_of)).splitlines(), 1):
        if f"# {marker}" in line:
            return number
    raise AssertionError(marker)


class BranchesOnItem(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.half(x) * 2

    def half(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum().item() > 0:  # item branch
            return x / 2
        return x


class BranchesOnItsBuffer(torch.nn.Module):
    """EoMT in small: whether a block runs is read from a buffer of the model."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("probs", torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.probs[0] > 0:  # buffer branch
            x = x + 1
        return x


def _failed(tmp_path: Path, model: torch.nn.Module) -> tuple[fx2onnx.OnnxExporterError, str]:
    report = tmp_path / "failure.sarif"
    with pytest.raises(fx2onnx.OnnxExporterError) as failed:
        fx2onnx.dynamo_export(model, torch.randn(2, 4), export_options=fx2onnx.ExportOptions(failure_report_path=report))
    validate_sarif(report)
    (result,) = [r for run in json.loads(report.read_text())["runs"] for r in run["results"] if r["level"] == "error"]
    return failed.value, result["message"]["text"]


def test_the_hint_and_report_name_the_models_line(tmp_path: Path) -> None:
    error, reported = _failed(tmp_path, BranchesOnItem())
    line = line_of("item branch")
    named = f"test_value_branches.py:{line} in half (`if x.sum().item() > 0:  # item branch`)"
    hint = reported.split("Hint: ", 1)[1]
    assert f"depends on a tensor's values at {Path(__file__)}:{line} in half" in hint and named in hint
    assert "torch.cond" in hint and named in str(error)
    (diagnostic,) = error.diagnostic_context.errors()
    assert (diagnostic.location.path, diagnostic.location.line) == (__file__, line)
    branch = value_branch(BranchesOnItem(), error)
    assert (branch.line, branch.function, branch.held) == (line, "half", ())
    assert branch.cause.startswith("GuardOnDataDependentSymNode: Could not guard on data-dependent expression")
    # another failure, or another model's code, is not named so
    assert value_branch(BranchesOnItem(), RuntimeError("shapes do not match")) is None
    assert value_branch(torch.nn.Linear(2, 2), error) is None


def test_a_branch_on_a_buffers_value_is_not_blamed_on_the_inputs(tmp_path: Path) -> None:
    error, reported = _failed(tmp_path, BranchesOnItsBuffer())
    hint = reported.split("Hint: ", 1)[1]
    assert hint.startswith(
        "the model's code decides a Python branch or size by the value of its buffer 'probs' at "
        f"{Path(__file__)}:{line_of('buffer branch')} in forward (`if self.probs[0] > 0:  # buffer branch`)")
    assert "no input or option changes it" in hint and "torch._check" not in hint
