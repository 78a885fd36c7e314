"""SARIF emission: schema validity, what real consumers read, files on disk."""

from __future__ import annotations

import copy
import gzip
import json
import logging
import os
from collections import Counter
from pathlib import Path

import pytest
from sarif_checks import sarif_tools_csv, sarif_tools_summary, validate_sarif

from diagnostics import DiagnosticContext, DiagnosticOptions, Level, Location, Stack, rules

NET = "/home/ada/project/models/net.py"


def _context(verbosity: int = logging.INFO) -> DiagnosticContext:
    return DiagnosticContext(
        "fx2onnx", "0.1.0", DiagnosticOptions(verbosity_level=verbosity),
        information_uri="https://example.org/fx2onnx",
    )


def _mixed_context() -> DiagnosticContext:
    """Two errors, one warning, two notes and one level-none record."""
    ctx = _context(logging.DEBUG)
    ctx.record(rules.FX_PASS, pass_name="Functionalize")
    ctx.record(rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION, target="aten::frob.default",
               location=Location(NET, 42, 9, "y = frob(x)", "forward"))
    ctx.record(rules.FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION, Level.WARNING,
               function="aten_add", match="nearest", target="aten::add.Tensor",
               location=Location(NET, 43))
    ctx.record(rules.GRAPH_BUILDING, function="aten_gather", node="gather_1", reason="rank",
               location=Location(NET, 44))
    ctx.record(rules.EXPORT_SUMMARY, model="Net", summary="3 nodes")
    ctx.record(rules.FIND_OPERATOR_OVERLOADS_IN_ONNX_REGISTRY, Level.NOTE, node="add")
    return ctx


def test_dump_passes_schema_and_semantic_checks_and_sarif_tools_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "report.sarif"
    _mixed_context().dump(path)
    log = validate_sarif(path)
    assert log["$schema"] == "https://json.schemastore.org/sarif-2.1.0.json"
    rows = sarif_tools_csv(path)
    # sarif-tools groups rows by severity, so compare without order.
    assert sorted((row["Severity"], row["Code"]) for row in rows) == sorted([
        ("none", "FXE0010"),
        ("error", "FXE0011"),
        ("warning", "FXE0014"),
        ("error", "FXE0019"),
        ("note", "FXE0018"),
        ("note", "FXE0016"),
    ])
    assert Counter(row["Severity"] for row in rows) == {"error": 2, "warning": 1, "note": 2, "none": 1}
    assert {row["Tool"] for row in rows} == {"fx2onnx"}
    (frob,) = [row for row in rows if row["Code"] == "FXE0011"]
    assert (frob["Location"], frob["Line"]) == (f"file://{NET}", "42")
    summary = sarif_tools_summary(path)
    assert "error: 2" in summary and "warning: 1" in summary and "note: 2" in summary
    assert "FXE0011" in summary and "FXE0019" in summary


def test_rules_are_the_used_ones_in_first_use_order_with_matching_indices() -> None:
    log = _mixed_context().sarif_log()
    (run,) = log["runs"]
    driver = run["tool"]["driver"]
    assert (driver["name"], driver["version"], driver["informationUri"]) == (
        "fx2onnx", "0.1.0", "https://example.org/fx2onnx",
    )
    ids = [rule["id"] for rule in driver["rules"]]
    assert ids == ["FXE0010", "FXE0011", "FXE0014", "FXE0019", "FXE0018", "FXE0016"]
    for result in run["results"]:
        assert ids[result["ruleIndex"]] == result["ruleId"]
    descriptor = driver["rules"][1]
    rule = rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION
    assert descriptor["name"] == rule.name
    assert descriptor["shortDescription"]["text"] == rule.short_description
    assert descriptor["fullDescription"]["text"] == rule.full_description
    assert descriptor["help"]["text"] == rule.help_text
    assert descriptor["defaultConfiguration"] == {"level": "error"}
    assert run["invocations"] == [{"executionSuccessful": False}]
    assert run["columnKind"] == "unicodeCodePoints"


def test_every_result_has_an_explicit_level_and_kind_only_for_none() -> None:
    results = _mixed_context().sarif_log()["runs"][0]["results"]
    assert [r["level"] for r in results] == ["none", "error", "warning", "error", "note", "note"]
    assert [r.get("kind") for r in results] == ["informational"] + [None] * 5


def test_three_errors_at_three_locations(tmp_path: Path) -> None:
    ctx = _context()
    for line, target in ((12, "aten::a"), (30, "aten::b"), (57, "aten::c")):
        ctx.record(rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION, target=target,
                   location=Location(NET, line, snippet=f"use({target!r})"))
    path = tmp_path / "three.sarif"
    ctx.dump(path)
    results = validate_sarif(path)["runs"][0]["results"]
    regions = [r["locations"][0]["physicalLocation"]["region"] for r in results]
    assert [region["startLine"] for region in regions] == [12, 30, 57]
    assert regions[0]["snippet"] == {"text": "use('aten::a')"}
    assert "startColumn" not in regions[0]
    assert [r["message"]["text"].split()[-3] for r in results] == ["aten::a", "aten::b", "aten::c"]
    rows = sarif_tools_csv(path)
    assert [(row["Severity"], row["Code"], row["Line"]) for row in rows] == [
        ("error", "FXE0011", "12"), ("error", "FXE0011", "30"), ("error", "FXE0011", "57"),
    ]


def test_region_column_and_markdown_message() -> None:
    ctx = _context()
    diag = ctx.record(rules.CAPTURE_FAILURE, reason="data-dependent branch",
                      location=Location(NET, 5, column=12))
    plain = ctx.record(rules.CAPTURE_FAILURE, reason="again")
    with diag.log_section("Graph break", logging.INFO):
        diag.log("`if x.sum() > 0:`", logging.INFO)
    results = validate_sarif(ctx.sarif_log())["runs"][0]["results"]
    assert results[0]["locations"][0]["physicalLocation"]["region"] == {"startLine": 5, "startColumn": 12}
    assert results[0]["message"] == {
        "text": diag.message,
        "markdown": diag.message + "\n\n## Graph break\n\n`if x.sum() > 0:`",
    }
    assert results[1]["message"] == {"text": plain.message, "markdown": plain.message}  # every result has both
    assert "locations" not in results[1]


@pytest.mark.parametrize(
    ("path", "uri"),
    [
        ("/home/ada/my project/net.py", "file:///home/ada/my%20project/net.py"),
        ("/home/ada/modèles/net.py", "file:///home/ada/mod%C3%A8les/net.py"),
        ("C:\\Users\\ada\\net.py", "file:///C:/Users/ada/net.py"),
    ],
)
def test_paths_become_percent_encoded_absolute_file_uris(path: str, uri: str) -> None:
    ctx = _context()
    ctx.record(rules.CAPTURE_FAILURE, reason="r", location=Location(path, 3))
    log = validate_sarif(ctx.sarif_log())
    assert log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"] == {
        "uri": uri
    }


def test_relative_path_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    ctx = _context()
    ctx.record(rules.CAPTURE_FAILURE, reason="r", location=Location("models/net.py", 3))
    log = validate_sarif(ctx.sarif_log())
    uri = log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert uri == (tmp_path / "models" / "net.py").as_uri()


def test_pseudo_files_get_no_location_but_stay_in_stack_messages() -> None:
    ctx = _context()
    stack = Stack.from_python_traceback(
        f'  File "{NET}", line 42, in forward\n    y = self.block(x)\n'
        '  File "<eval_with_key>.7", line 6, in forward\n'
    )
    ctx.record(rules.GRAPH_BUILDING, function="f", node="n", reason="r",
               location=stack.innermost(), stack=stack)
    (result,) = validate_sarif(ctx.sarif_log())["runs"][0]["results"]
    assert "locations" not in result
    (sarif_stack,) = result["stacks"]
    inner, outer = sarif_stack["frames"]  # SARIF lists the innermost frame first
    assert inner == {"location": {"message": {"text": "forward (<eval_with_key>.7:6)"}}}
    assert outer["location"]["physicalLocation"]["region"] == {
        "startLine": 42, "snippet": {"text": "y = self.block(x)"},
    }
    assert outer["location"]["message"] == {"text": "forward"}


def test_properties_are_made_json_safe() -> None:
    class Shape:
        def __str__(self) -> str:
            return "torch.Size([2, 3])"

    ctx = _context()
    ctx.record(rules.GRAPH_BUILDING, message="max abs diff nan",
               properties={"maxAbsDiff": float("nan"), "rtol": 1e-4, "shape": Shape(),
                           "inputs": ("x", 2), 3: {"inf": float("-inf")}})
    text = ctx.to_json()
    assert "NaN" not in text and "Infinity" not in text
    (result,) = validate_sarif(json.loads(text))["runs"][0]["results"]
    assert result["properties"] == {
        "maxAbsDiff": "nan", "rtol": 1e-4, "shape": "torch.Size([2, 3])",
        "inputs": ["x", 2], "3": {"inf": "-inf"},
    }


def test_clean_export_log_is_valid_and_successful(tmp_path: Path) -> None:
    ctx = _context(logging.WARNING)
    ctx.record(rules.EXPORT_SUMMARY, model="Net", summary="ok")  # a note, dropped at WARNING
    path = tmp_path / "clean.sarif"
    ctx.dump(path)
    run = validate_sarif(path)["runs"][0]
    assert run["results"] == [] and run["tool"]["driver"]["rules"] == []
    assert run["invocations"] == [{"executionSuccessful": True}]
    assert sarif_tools_csv(path) == []


@pytest.mark.parametrize(
    ("name", "compress", "required"),
    [("report.json", False, "'.sarif'"), ("report.sarif.gz", False, "'.sarif'"),
     ("report.sarif", True, "'.sarif.gz'"), ("report.gz", True, "'.sarif.gz'")],
)
def test_dump_rejects_the_wrong_extension(tmp_path: Path, name: str, compress: bool, required: str) -> None:
    with pytest.raises(ValueError, match=f"ending in {required}"):
        _context().dump(tmp_path / name, compress=compress)
    assert list(tmp_path.iterdir()) == []


def test_dump_compressed_writes_gzip(tmp_path: Path) -> None:
    ctx = _mixed_context()
    path = tmp_path / "report.sarif.gz"
    ctx.dump(path, compress=True)
    data = path.read_bytes()
    assert data[:2] == b"\x1f\x8b"
    assert json.loads(gzip.decompress(data)) == ctx.sarif_log()
    assert len(validate_sarif(path)["runs"][0]["results"]) == 6


def test_dump_replaces_atomically_and_leaves_no_temp_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "report.sarif"
    path.write_text("old report")
    ctx = _mixed_context()

    def crash(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        ctx.dump(path)
    assert path.read_text() == "old report"
    assert [p.name for p in tmp_path.iterdir()] == ["report.sarif"]

    monkeypatch.undo()
    ctx.dump(path)
    assert json.loads(path.read_text(encoding="utf-8")) == ctx.sarif_log()
    assert [p.name for p in tmp_path.iterdir()] == ["report.sarif"]


def test_validator_catches_what_the_schema_misses(tmp_path: Path) -> None:
    good = _mixed_context().sarif_log()

    def broken(change) -> dict:
        log = copy.deepcopy(good)
        change(log)
        return log

    result = lambda log: log["runs"][0]["results"][1]  # noqa: E731
    region = lambda log: result(log)["locations"][0]["physicalLocation"]["region"]  # noqa: E731
    artifact = lambda log: result(log)["locations"][0]["physicalLocation"]["artifactLocation"]  # noqa: E731
    cases = {
        "ruleIndex 2 points at 'FXE0014'": lambda log: result(log).update(ruleIndex=2),
        "'FXE9999' is not in tool.driver.rules": lambda log: result(log).update(ruleId="FXE9999"),
        "startLine 0 < 1": lambda log: region(log).update(startLine=0),
        "not a valid URI": lambda log: artifact(log).update(uri="/home/ada/my net.py"),
        "not a file URI": lambda log: artifact(log).update(uri="https://example.org/net.py"),
        "relative URI": lambda log: artifact(log).update(uri="models/net.py"),
        "does not name sarif-2.1.0": lambda log: log.update({"$schema": "https://x.org/sarif-2.2.json"}),
        "version is '2.2.0'": lambda log: log.update(version="2.2.0"),
        "requires level 'none'": lambda log: result(log).update(kind="pass"),
    }
    for expected, change in cases.items():
        with pytest.raises(AssertionError, match=expected.replace("(", r"\(")):
            validate_sarif(broken(change))

    nan_file = tmp_path / "nan.sarif"
    nan_file.write_text(json.dumps(broken(lambda log: result(log).update(properties={"x": float("nan")}))))
    with pytest.raises(AssertionError, match="NaN"):
        validate_sarif(nan_file)


def test_validator_reports_schema_errors() -> None:
    log = _mixed_context().sarif_log()
    log["runs"][0]["results"][1]["level"] = "fatal"
    del log["runs"][0]["results"][0]["message"]
    with pytest.raises(AssertionError, match=r"schema: at /runs/0/results/0: 'message' is a required property"):
        validate_sarif(log)
