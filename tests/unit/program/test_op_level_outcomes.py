"""Op-level debugging records each node's outcome under its own rule (FXE0013), as the
former `torch.onnx.dynamo_export` did: level none when the node's ONNX nodes ran and match
PyTorch, a warning when they could not be run (saying why) or differ."""

from __future__ import annotations

import json

import onnxscript
import torch
from onnxscript import FLOAT

import fx2onnx
from conftest import export_program, make_options
from diagnostics import Level, rules


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.sigmoid(self.fc(x)) - 0.5)


def _sarif_results(path) -> list[dict]:
    log = json.loads(path.read_text(encoding="utf-8"))
    return [result for run in log["runs"] for result in run.get("results", [])]


def test_each_node_that_ran_and_matches_is_recorded_at_level_none(tmp_path) -> None:
    model, x = Small(), torch.randn(5, 4)
    options = make_options(tmp_path, op_level_debug=True, module_functions=False)
    program = export_program(model, (x,), options=options, tmp_path=tmp_path)
    torch.testing.assert_close(program(x), model(x))  # onnxruntime against PyTorch

    outcomes = [d for d in program.diagnostics if d.rule is rules.OP_LEVEL_VALIDATION and d.level is Level.NONE]
    summary = next(d for d in program.diagnostics if d.rule is rules.OP_LEVEL_VALIDATION and d.level is Level.NOTE)
    assert len(outcomes) == summary.properties["checked"] >= 4  # one per checked node, at default verbosity
    assert {d.properties["outcome"] for d in outcomes} == {"matched"}
    relu = next(d for d in outcomes if d.properties["target"] == "aten.relu.default")
    assert relu.properties["max_difference"] < 1e-5 and "agree" in relu.message
    assert relu.location is not None and "test_op_level_outcomes.py" in relu.location.path
    assert not [d for d in program.diagnostics if d.rule is rules.OP_LEVEL_VALIDATION and d.level is Level.WARNING]

    program.save_diagnostics(tmp_path / "outcomes.sarif")
    results = [r for r in _sarif_results(tmp_path / "outcomes.sarif") if r["ruleId"] == "FXE0013"]
    assert sum(r["level"] == "none" for r in results) == len(outcomes)
    assert any(r["level"] == "none" and "aten.relu.default" in r["message"]["text"] for r in results)


_UNKNOWN = onnxscript.values.Opset("com.example.unknown", 1)


@onnxscript.script(onnxscript.values.Opset("pkg.test.oplevel", 1))
def unrunnable_relu(x: FLOAT) -> FLOAT:
    # an operator of a domain onnxruntime has no kernels for: the node cannot be run
    return _UNKNOWN.MyRelu(x)


def test_a_node_whose_onnx_nodes_cannot_run_is_a_warning_saying_why(tmp_path) -> None:
    registry = fx2onnx.OnnxRegistry()
    registry.register_op(unrunnable_relu, "aten", "relu")
    options = make_options(tmp_path, op_level_debug=True, module_functions=False, onnx_registry=registry)
    program = export_program(Small(), (torch.randn(5, 4),), options=options, tmp_path=tmp_path)

    not_run = [d for d in program.diagnostics if d.rule is rules.OP_LEVEL_VALIDATION and d.level is Level.WARNING]
    assert [d.properties["fx_node"] for d in not_run] == ["relu"]
    (warning,) = not_run
    assert warning.properties["outcome"] == "not_run"
    assert "could not run FX node 'relu' (aten.relu.default) in ONNX Runtime" in warning.message
    assert "MyRelu" in warning.properties["reason"]  # why: onnxruntime's own refusal
    # the other nodes still ran and matched
    matched = [d for d in program.diagnostics if d.rule is rules.OP_LEVEL_VALIDATION and d.level is Level.NONE]
    assert "sigmoid" in {d.properties["fx_node"] for d in matched}

    program.save_diagnostics(tmp_path / "not_run.sarif")
    results = _sarif_results(tmp_path / "not_run.sarif")
    assert any(r["ruleId"] == "FXE0013" and r["level"] == "warning" and "relu" in r["message"]["text"] for r in results)
