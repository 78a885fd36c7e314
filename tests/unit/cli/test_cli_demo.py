"""The main job: `python -m fx2onnx demo` exports, verifies and writes both files."""

from __future__ import annotations

import onnx

from fx2onnx.cli.main import main
from sarif_checks import validate_sarif


def test_demo_writes_a_valid_model_and_report_and_passes(tmp_path, capsys):
    model_path, report_path = tmp_path / "demo.onnx", tmp_path / "demo.sarif"
    assert main(["demo", "--output", str(model_path), "--report", str(report_path)]) == 0
    printed = capsys.readouterr().out
    assert "verification: PASS" in printed
    onnx.checker.check_model(str(model_path), full_check=True)
    log = validate_sarif(report_path)
    results = log["runs"][0]["results"]
    # the summary note, and the dispatch decisions at level none (every node a perfect match)
    assert [r["ruleId"] for r in results if r["level"] != "none"] == ["FXE0018"]
    assert {r["ruleId"] for r in results if r["level"] == "none"} <= {"FXE0014"}


def test_demo_with_dynamic_shapes_checks_a_second_input_size(tmp_path, capsys):
    model_path = tmp_path / "demo.onnx"
    assert main(["demo", "--dynamic", "--output", str(model_path), "--report", str(tmp_path / "d.sarif")]) == 0
    printed = capsys.readouterr().out
    assert "[2, 16] and [3, 11]" in printed and "verification: PASS" in printed
    dims = [d.dim_param for d in onnx.load(str(model_path)).graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["input_ids_dim_0", "input_ids_dim_1"]
