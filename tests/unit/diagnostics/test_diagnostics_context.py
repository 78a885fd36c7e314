"""DiagnosticContext: what gets recorded, warnings_as_errors, scopes and the summary."""

from __future__ import annotations

import logging

import pytest

from diagnostics import (
    Diagnostic,
    DiagnosticContext,
    DiagnosticOptions,
    Level,
    Location,
    rules,
)


def _context(verbosity: int = logging.INFO, warnings_as_errors: bool = False) -> DiagnosticContext:
    options = DiagnosticOptions(verbosity_level=verbosity, warnings_as_errors=warnings_as_errors)
    return DiagnosticContext("fx2onnx", "0.1.0", options)


def _record_one_of_each(ctx: DiagnosticContext) -> list[Diagnostic]:
    return [
        ctx.record(rules.FX_NODE_TO_ONNX, Level.NONE, node="add_1"),
        ctx.record(rules.FX_NODE_TO_ONNX, Level.NOTE, node="mul_1"),
        ctx.record(rules.OP_LEVEL_VALIDATION, Level.WARNING, node="n", function="f", reason="r"),
        ctx.record(rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION, Level.ERROR, target="aten::x"),
    ]


@pytest.mark.parametrize(
    ("verbosity", "recorded_levels"),
    [
        (logging.DEBUG, [Level.NONE, Level.NOTE, Level.WARNING, Level.ERROR]),
        (logging.INFO, [Level.NOTE, Level.WARNING, Level.ERROR]),
        (logging.WARNING, [Level.WARNING, Level.ERROR]),
        (logging.CRITICAL, [Level.WARNING, Level.ERROR]),  # warnings/errors are never dropped
    ],
)
def test_verbosity_gates_recording(verbosity: int, recorded_levels: list[Level]) -> None:
    ctx = _context(verbosity)
    returned = _record_one_of_each(ctx)
    assert [d.level for d in ctx.diagnostics] == recorded_levels
    # Every call returns a usable diagnostic, recorded or not.
    assert [d.level for d in returned] == [Level.NONE, Level.NOTE, Level.WARNING, Level.ERROR]
    assert returned[0].message == "Transforming FX node add_1 to ONNX."
    assert [ctx.would_record(level) for level in Level] == [
        level in recorded_levels for level in Level
    ]


def test_defaults_to_info_verbosity_and_rule_default_level() -> None:
    ctx = DiagnosticContext("fx2onnx", "0.1.0")
    assert ctx.options == DiagnosticOptions(logging.INFO, False)
    quiet = ctx.record(rules.FX_PASS, pass_name="Functionalize")  # default level NONE
    loud = ctx.record(rules.CAPTURE_FAILURE, reason="data-dependent branch")  # default ERROR
    assert quiet.level is Level.NONE and loud.level is Level.ERROR
    assert ctx.diagnostics == [loud]


def test_explicit_message_and_location_and_properties_are_kept() -> None:
    ctx = _context()
    where = Location("/src/net.py", 7, 9, "y = x.frob()", "forward")
    diag = ctx.record(
        rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION,
        message="custom text",
        location=where,
        properties={"fxNode": "frob_1"},
    )
    assert (diag.message, diag.location, diag.properties) == ("custom text", where, {"fxNode": "frob_1"})


def test_errors_warnings_and_has_errors() -> None:
    ctx = _context()
    assert not ctx.has_errors()
    recorded = _record_one_of_each(ctx)
    assert ctx.errors() == [recorded[3]]
    assert ctx.warnings() == [recorded[2]]
    assert ctx.has_errors()


def test_warnings_as_errors_promotes_and_says_so() -> None:
    ctx = _context(warnings_as_errors=True)
    diag = ctx.record(
        rules.FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION,
        Level.WARNING,
        function="aten_add",
        match="nearest",
        target="aten::add.Tensor",
    )
    note = ctx.record(rules.EXPORT_SUMMARY, model="Net", summary="ok")
    assert diag.level is Level.ERROR
    assert diag.message.startswith("The ONNX function aten_add is the nearest match")
    assert "warning was promoted to an error" in diag.message
    assert diag.properties["promotedFromWarning"] is True
    assert note.level is Level.NOTE  # only warnings are promoted
    assert ctx.errors() == [diag] and ctx.has_errors()


def test_raising_level_later_records_a_dropped_diagnostic_once() -> None:
    ctx = _context(logging.INFO)
    diag = ctx.record(rules.FX_NODE_TO_ONNX, node="frob_1")  # NONE: dropped at INFO
    assert ctx.diagnostics == []
    diag.level = Level.ERROR
    diag.level = Level.ERROR
    assert ctx.diagnostics == [diag] and ctx.has_errors()


def test_raising_level_to_warning_with_warnings_as_errors_gives_error() -> None:
    ctx = _context(warnings_as_errors=True)
    diag = ctx.record(rules.FIND_OPERATOR_OVERLOADS_IN_ONNX_REGISTRY, node="add")
    diag.level = Level.WARNING
    assert diag.level is Level.ERROR and ctx.errors() == [diag]


def test_scope_turns_an_exception_into_an_error_with_its_traceback() -> None:
    ctx = _context()
    with pytest.raises(KeyError, match="no such value"):
        with ctx.scope(rules.FX_NODE_TO_ONNX, node="getitem_3") as diag:
            diag.log("about to fail", logging.INFO)
            raise KeyError("no such value")
    assert ctx.errors() == [diag]
    assert isinstance(diag.source_exception, KeyError)
    # the message states the cause, not only what was being done
    assert diag.message.endswith("Failed: KeyError: 'no such value'")
    assert "getitem_3" in diag.message
    markdown = diag.markdown()
    assert "about to fail" in markdown
    assert "## Exception log" in markdown and "KeyError: 'no such value'" in markdown


def test_scope_without_exception_keeps_the_level() -> None:
    ctx = _context(logging.DEBUG)
    with ctx.scope(rules.FX_PASS, pass_name="Modularize") as diag:
        pass
    assert diag.level is Level.NONE and ctx.diagnostics == [diag]


def test_recorded_diagnostics_reach_python_logging(caplog: pytest.LogCaptureFixture) -> None:
    ctx = _context()
    with caplog.at_level(logging.DEBUG, logger="diagnostics"):
        ctx.record(rules.CAPTURE_FAILURE, reason="untraceable call")
        ctx.record(rules.FX_PASS, pass_name="dropped")  # not recorded, not logged
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.ERROR, "[FXE0017] torch.export could not capture the model: untraceable call")
    ]


def test_summary_text_lists_errors_and_warnings_with_places_and_help_once() -> None:
    ctx = _context()
    ctx.record(rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION, target="aten::a",
               location=Location("/src/models/net.py", 12))
    ctx.record(rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION, target="aten::b",
               location=Location("/src/models/net.py", 30))
    ctx.record(rules.OP_LEVEL_VALIDATION, node="n", function="f", reason="max diff 0.5")
    ctx.record(rules.EXPORT_SUMMARY, model="Net", summary="ok")  # a note: not listed
    text = ctx.summary_text()
    lines = text.splitlines()
    assert "- [FXE0011] No ONNX function to convert the call_function node aten::a to ONNX. (at /src/models/net.py:12)" in lines
    assert "- [FXE0011] No ONNX function to convert the call_function node aten::b to ONNX. (at /src/models/net.py:30)" in lines
    assert "- [FXE0013] FX node n and its ONNX function f disagree in op-level validation: max diff 0.5" in lines
    assert lines[0] == "2 errors:" and "1 warning:" in lines
    assert "FXE0018" not in text
    assert text.count(rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION.help_text) == 1
    assert text.count(rules.OP_LEVEL_VALIDATION.help_text) == 1
    # Errors come before warnings.
    assert text.index("aten::b") < text.index("[FXE0013] FX node")


def test_summary_text_when_clean() -> None:
    ctx = _context()
    ctx.record(rules.EXPORT_SUMMARY, model="Net", summary="ok")
    assert ctx.summary_text() == "No errors or warnings."
