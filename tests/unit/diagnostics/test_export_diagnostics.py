"""End-to-end diagnostics of dynamo_export: every problem in one pass, at the user's line.

Each test exports a small model and checks the diagnostics (in memory, in the SARIF file
and through sarif-tools): three unsupported operators give three errors at their own
lines, capture failures point at the failing line, warnings_as_errors fails a
nearest-match export, and each pass, node and dispatch decision is located in the model's
source (this file, or the transformers modeling file for a transformers model).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import onnxscript
import pytest
import torch
from onnxscript import INT64
from onnxscript import opset18 as op

import fx2onnx
from diagnostics import Level, rules
from dispatcher import node_location
from sarif_checks import sarif_tools_csv, sarif_tools_summary, validate_sarif

THIS_FILE = os.path.abspath(__file__)


def line_of(marker: str) -> int:
    """The line of this file that ends with the comment ``# <marker>``."""
    lines = Path(THIS_FILE).read_text(encoding="utf-8").splitlines()
    found = [i + 1 for i, line in enumerate(lines) if line.rstrip().endswith(f"# {marker}")]
    assert len(found) == 1, f"marker {marker!r} found on lines {found}"
    return found[0]


def _custom_op(name: str):
    """A custom operator with a fake implementation and no ONNX function."""

    @torch.library.custom_op(f"fx2onnx_diag_test::{name}", mutates_args=())
    def function(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    @function.register_fake
    def _(x):
        return torch.empty_like(x)

    return function


op_alpha = _custom_op("alpha")
op_beta = _custom_op("beta")
op_gamma = _custom_op("gamma")
op_narrow = _custom_op("narrow")
op_broken = _custom_op("broken")


@onnxscript.script()
def double_int64_only(x: INT64) -> INT64:
    """An ONNX function that declares INT64 inputs only: a nearest match for floats."""
    return op.Add(x, x)


def _broken(x):
    raise RuntimeError("this ONNX function fails on purpose")


broken_function = onnxscript.values.TracedOnnxFunction(op, _broken)


class ThreeUnsupported(torch.nn.Module):
    def forward(self, x):
        a = op_alpha(x)  # alpha
        b = op_beta(a.relu())  # beta
        c = op_gamma(b * 2)  # gamma
        return c.sum()


class NearestMatch(torch.nn.Module):
    def forward(self, x):
        return op_narrow(x).relu()  # narrow


class BrokenTranslation(torch.nn.Module):
    def forward(self, x):
        y = op_broken(x)  # broken
        z = y + 1
        return z * y, x.sin()


class DataDependent(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent
            return x + 1
        return x - 1


class Untraceable(torch.nn.Module):
    def forward(self, x):
        address = x.data_ptr()  # untraceable
        return x + address


class PromotedAdd(torch.nn.Module):
    def forward(self, x):
        return x + torch.arange(3)  # promotion


def narrow_registry() -> fx2onnx.OnnxRegistry:
    registry = fx2onnx.OnnxRegistry()
    registry.register_op(double_int64_only, "fx2onnx_diag_test", "narrow")
    registry.register_op(broken_function, "fx2onnx_diag_test", "broken")
    return registry


def export_failure(model, *args, **option_kwargs) -> fx2onnx.OnnxExporterError:
    with pytest.raises(fx2onnx.OnnxExporterError) as info:
        fx2onnx.dynamo_export(model, *args, export_options=fx2onnx.ExportOptions(**option_kwargs))
    return info.value


def results_of(log: dict) -> list[dict]:
    return log["runs"][0]["results"]


def primary(result: dict) -> tuple[str, int]:
    location = result["locations"][0]["physicalLocation"]
    return location["artifactLocation"]["uri"], location["region"]["startLine"]


# -- every problem in one pass -------------------------------------------------------------


def test_three_unsupported_operators_give_three_errors_at_their_lines(tmp_path):
    report = tmp_path / "three.sarif"
    error = export_failure(ThreeUnsupported(), torch.randn(2, 3), failure_report_path=report)

    context = error.onnx_program.diagnostic_context
    assert error.diagnostic_context is context
    errors = context.errors()
    assert [d.rule.id for d in errors] == ["FXE0012"] * 3
    expected = {
        "fx2onnx_diag_test::alpha": line_of("alpha"),
        "fx2onnx_diag_test::beta": line_of("beta"),
        "fx2onnx_diag_test::gamma": line_of("gamma"),
    }
    assert {d.properties["operator"]: (d.location.path, d.location.line) for d in errors} == {
        name: (THIS_FILE, line) for name, line in expected.items()
    }

    # The message lists each problem: operator, file:line, and what to do.
    message = str(error)
    assert "3 errors" in message
    for name, line in expected.items():
        assert name in message
        assert f"{THIS_FILE}:{line}" in message
    assert "What to do" in message and "register_op" in message
    assert str(report.absolute()) in message

    # In the SARIF file: three errors, one summary note, each error at its own line.
    log = validate_sarif(report)
    errors_in_file = [r for r in results_of(log) if r["level"] == "error"]
    assert sorted(primary(r)[1] for r in errors_in_file) == sorted(expected.values())
    assert all(primary(r)[0] == Path(THIS_FILE).as_uri() for r in errors_in_file)
    assert all(r["stacks"][0]["frames"] for r in errors_in_file)
    assert [r["ruleId"] for r in results_of(log) if r["level"] == "note"] == ["FXE0018"]

    rows = sarif_tools_csv(report)
    assert sorted((row["Severity"], row["Code"], int(row["Line"])) for row in rows if row["Severity"] == "error") == sorted(
        ("error", "FXE0012", line) for line in expected.values()
    )
    summary = sarif_tools_summary(report)
    assert "error: 3" in summary and "FXE0012" in summary


class RepeatedUnsupported(torch.nn.Module):
    """One unsupported operator in every one of seven layers, and another once."""

    def forward(self, x):
        for _ in range(7):
            x = op_alpha(x).relu()  # alpha in a loop
        return op_beta(x)  # beta once


def test_identical_unsupported_nodes_are_one_problem_with_a_count(tmp_path):
    report = tmp_path / "repeated.sarif"
    error = export_failure(RepeatedUnsupported(), torch.randn(2, 3), failure_report_path=report)
    errors = error.diagnostic_context.errors()
    assert [(d.rule.id, d.properties["operator"], d.properties["count"]) for d in errors] == [
        ("FXE0012", "fx2onnx_diag_test::alpha", 7), ("FXE0012", "fx2onnx_diag_test::beta", 1),
    ]
    alpha = errors[0]
    assert (alpha.location.path, alpha.location.line) == (THIS_FILE, line_of("alpha in a loop"))
    assert len(alpha.properties["fx_nodes"]) == 7
    assert "7 FX nodes alike (" in alpha.message and "and 2 more)" in alpha.message
    assert "2 errors" in str(error)
    assert [r["ruleId"] for r in results_of(validate_sarif(report)) if r["level"] == "error"] == ["FXE0012"] * 2


def test_each_problem_is_reported_once(tmp_path):
    """The analysis (FXE0012) and the dispatcher (FXE0011) never both report a node, and
    the users of a failed node are skipped instead of failing again."""
    error = export_failure(ThreeUnsupported(), torch.randn(2, 3), failure_report_path=None)
    context = error.diagnostic_context
    problems = [d for d in context.diagnostics if d.level >= Level.WARNING]
    nodes = [d.properties.get("fx_node") for d in problems]
    assert len(nodes) == len(set(nodes)) == 3
    assert not [d for d in problems if d.rule.id == rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION.id]

    # A node whose ONNX function fails: one FXE0019 error; its users (add, mul) are skipped.
    error = export_failure(
        BrokenTranslation(), torch.randn(2, 3), onnx_registry=narrow_registry(), failure_report_path=tmp_path / "b.sarif"
    )
    (failure,) = error.diagnostic_context.errors()
    assert failure.rule.id == rules.GRAPH_BUILDING.id
    assert (failure.location.path, failure.location.line) == (THIS_FILE, line_of("broken"))
    assert "fails on purpose" in failure.message
    assert "fails on purpose" in failure.markdown()  # the traceback is in the log
    log = validate_sarif(tmp_path / "b.sarif")
    assert [r["ruleId"] for r in results_of(log) if r["level"] == "error"] == ["FXE0019"]


# -- capture failures ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "marker", "original_text", "hint"),
    [
        (DataDependent(), "data-dependent", "data-dependent", "torch.cond"),
        (Untraceable(), "untraceable", "data pointer", "custom_op"),
    ],
    ids=["data-dependent-branch", "untraceable-call"],
)
def test_capture_failure_reports_the_users_line(tmp_path, model, marker, original_text, hint):
    report = tmp_path / "capture.sarif"
    error = export_failure(model, torch.randn(2, 3), failure_report_path=report)

    (failure,) = error.diagnostic_context.errors()
    assert failure.rule.id == rules.CAPTURE_FAILURE.id
    assert (failure.location.path, failure.location.line) == (THIS_FILE, line_of(marker))
    assert original_text in failure.message and hint in failure.message
    assert f"{THIS_FILE}:{line_of(marker)}" in str(error)

    log = validate_sarif(report)
    (result,) = [r for r in results_of(log) if r["level"] == "error"]
    assert result["ruleId"] == "FXE0017"
    assert primary(result) == (Path(THIS_FILE).as_uri(), line_of(marker))
    assert "Traceback" in result["message"]["markdown"]  # the original error, in full
    rows = sarif_tools_csv(report)
    assert [(r["Severity"], r["Code"], int(r["Line"])) for r in rows if r["Severity"] == "error"] == [
        ("error", "FXE0017", line_of(marker))
    ]


# -- warnings as errors ----------------------------------------------------------------------


def test_nearest_match_is_a_warning_by_default(tmp_path):
    program = fx2onnx.dynamo_export(
        NearestMatch(), torch.randn(2, 3), export_options=fx2onnx.ExportOptions(onnx_registry=narrow_registry())
    )
    (warning,) = program.diagnostic_context.warnings()
    assert warning.rule.id == rules.FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION.id
    assert "nearest match" in warning.message and "double_int64_only" in warning.message
    assert (warning.location.path, warning.location.line) == (THIS_FILE, line_of("narrow"))

    program.save_diagnostics(tmp_path / "ok.sarif")
    validate_sarif(tmp_path / "ok.sarif")
    rows = sarif_tools_csv(tmp_path / "ok.sarif")
    problems = sorted((r["Severity"], r["Code"]) for r in rows if r["Severity"] != "none")
    assert problems == [("note", "FXE0018"), ("warning", "FXE0014")]
    # the other dispatch decisions: perfect matches, at level none


def test_warnings_as_errors_turns_a_nearest_match_into_a_failure(tmp_path):
    report = tmp_path / "strict.sarif"
    error = export_failure(
        NearestMatch(),
        torch.randn(2, 3),
        onnx_registry=narrow_registry(),
        diagnostic_options=fx2onnx.DiagnosticOptions(warnings_as_errors=True),
        failure_report_path=report,
    )
    (failure,) = error.diagnostic_context.errors()
    assert failure.rule.id == rules.FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION.id
    assert failure.properties["promotedFromWarning"] is True
    assert "warnings_as_errors" in str(error)
    assert f"{THIS_FILE}:{line_of('narrow')}" in str(error)

    log = validate_sarif(report)
    assert [r["level"] for r in results_of(log) if r["ruleId"] == "FXE0014" and r["level"] != "none"] == ["error"]
    rows = sarif_tools_csv(report)
    assert [(r["Severity"], r["Code"]) for r in rows if r["Severity"] in ("error", "warning")] == [("error", "FXE0014")]


# -- locations of passes, nodes, dispatch decisions and type promotions ----------------------


def test_debug_verbosity_locates_every_scope_in_the_users_code(tmp_path):
    program = fx2onnx.dynamo_export(
        PromotedAdd(),
        torch.randn(2, 3),
        export_options=fx2onnx.ExportOptions(diagnostic_options=fx2onnx.DiagnosticOptions(verbosity_level=logging.DEBUG)),
    )
    diagnostics = program.diagnostic_context.diagnostics
    by_rule = {}
    for d in diagnostics:
        by_rule.setdefault(d.rule.id, []).append(d)

    passes = by_rule[rules.FX_PASS.id]
    assert {"remove_assertions", "insert_type_promotion"} <= {d.message.split()[1] for d in passes}
    assert all(d.level == Level.NONE and d.properties["seconds"] >= 0 for d in passes)
    (graph,) = by_rule[rules.FX_GRAPH_TO_ONNX.id]
    assert "def forward" in graph.markdown()

    line = line_of("promotion")
    (promotion,) = by_rule[rules.FX_NODE_INSERT_TYPE_PROMOTION.id]
    assert (promotion.location.path, promotion.location.line) == (THIS_FILE, line)
    add_nodes = [d for d in by_rule[rules.FX_NODE_TO_ONNX.id] if "aten.add" in d.message]
    assert add_nodes and all((d.location.path, d.location.line) == (THIS_FILE, line) for d in add_nodes)
    assert all(d.stack and d.stack.frames[-1].path == THIS_FILE for d in add_nodes)
    assert "ONNX function: `aten_add`" in add_nodes[0].markdown()
    dispatches = [d for d in by_rule[rules.FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION.id] if "aten::add" in d.message]
    assert dispatches and all(d.location.line == line for d in dispatches)

    program.save_diagnostics(tmp_path / "debug.sarif")
    log = validate_sarif(tmp_path / "debug.sarif")
    node_results = [r for r in results_of(log) if r["ruleId"] == "FXE0008" and "aten.add" in r["message"]["text"]]
    assert primary(node_results[0]) == (Path(THIS_FILE).as_uri(), line)
    assert node_results[0]["stacks"][0]["frames"][0]["location"]["message"]["text"] == "forward"


def test_node_location_of_a_transformers_model_is_its_modeling_file():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=32, use_cache=False
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    exported = torch.export.export(model, (torch.randint(0, 100, (1, 8)),), strict=False)
    located = [node_location(n) for n in exported.graph.nodes if n.op == "call_function"]
    paths = {loc.path for loc in located if loc is not None}
    assert paths, "no call_function node has a location"
    assert any(p.endswith(os.path.join("transformers", "models", "gpt2", "modeling_gpt2.py")) for p in paths)
    torch_dir = os.path.dirname(torch.__file__)
    fx2onnx_dir = os.path.dirname(fx2onnx.__file__)
    assert not [p for p in paths if p.startswith((torch_dir, fx2onnx_dir)) or "/transformers/" not in p]


def test_user_code_in_a_folder_named_like_a_tool_package_is_still_user_code():
    """Frames are matched by where torch and fx2onnx are installed, not by folder names:
    a checkout at .../fx2onnx/tests/ (as on CI) is the user's code; stdlib frames are not."""
    import sysconfig

    from dispatcher import is_tool_frame, stack_location
    from diagnostics import Stack

    stdlib = os.path.join(sysconfig.get_paths()["stdlib"], "contextlib.py")
    trace = (
        '  File "/home/runner/work/fx2onnx/fx2onnx/tests/test_model.py", line 12, in forward\n'
        "    return self.block(x)\n"
        f'  File "{stdlib}", line 81, in inner\n'
        "    return func(*args, **kwds)\n"
        f'  File "{os.path.join(os.path.dirname(torch.__file__), "nn", "modules", "module.py")}", line 1775, in _call_impl\n'
        "    return forward_call(*args, **kwargs)\n"
    )
    location = stack_location(Stack.from_python_traceback(trace))
    assert (location.path, location.line) == ("/home/runner/work/fx2onnx/fx2onnx/tests/test_model.py", 12)
    assert is_tool_frame(stdlib) and is_tool_frame(fx2onnx.__file__) and is_tool_frame("<eval_with_key>.3")
    assert not is_tool_frame(THIS_FILE)
