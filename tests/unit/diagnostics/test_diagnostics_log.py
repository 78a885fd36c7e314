"""The markdown log of a Diagnostic: level gating, lazy text, sections, exceptions."""

from __future__ import annotations

import logging

from diagnostics import DiagnosticContext, DiagnosticOptions, rules


def _diag(verbosity: int):
    ctx = DiagnosticContext("fx2onnx", "0.1.0", DiagnosticOptions(verbosity_level=verbosity))
    return ctx.record(rules.CAPTURE_FAILURE, reason="r")


def test_log_keeps_only_levels_the_verbosity_allows() -> None:
    diag = _diag(logging.INFO)
    diag.log("debug detail")  # default level DEBUG
    diag.log("info detail", logging.INFO)
    diag.log("warning detail", logging.WARNING)
    assert diag.markdown() == "info detail\n\nwarning detail"
    assert diag.would_log(logging.INFO) and not diag.would_log(logging.DEBUG)

    verbose = _diag(logging.DEBUG)
    verbose.log("debug detail")
    assert verbose.markdown() == "debug detail"


def test_lazy_text_is_evaluated_once_and_only_when_kept() -> None:
    calls: list[str] = []

    def expensive(name: str):
        def render() -> str:
            calls.append(name)
            return f"rendered {name}"
        return render

    diag = _diag(logging.INFO)
    diag.log(expensive("graph"), logging.DEBUG)
    assert calls == []
    diag.log(expensive("signature"), logging.INFO)
    assert calls == ["signature"]
    diag.markdown()
    diag.markdown()
    assert calls == ["signature"]
    assert diag.markdown() == "rendered signature"


def test_nested_sections_give_deeper_headings() -> None:
    diag = _diag(logging.DEBUG)
    with diag.log_section("Function Signature", logging.INFO):
        diag.log("- x: Tensor(f32[2, 3])", logging.INFO)
        with diag.log_section("Checking perfect match"):
            diag.log("aten_add: perfect")
    with diag.log_section(lambda: "Return values"):
        diag.log("ok")
    assert diag.markdown() == (
        "## Function Signature\n\n- x: Tensor(f32[2, 3])\n\n"
        "### Checking perfect match\n\naten_add: perfect\n\n"
        "## Return values\n\nok"
    )


def test_a_dropped_section_drops_its_content() -> None:
    diag = _diag(logging.INFO)
    with diag.log_section("FX Graph", logging.DEBUG):
        diag.log("graph():", logging.INFO)
    with diag.log_section("Inputs", logging.INFO):
        diag.log("x", logging.INFO)
    assert diag.markdown() == "## Inputs\n\nx"


def test_source_exception_is_always_kept_with_its_traceback() -> None:
    diag = _diag(logging.CRITICAL)
    diag.log("secret detail", logging.ERROR)
    try:
        {}["missing"]
    except KeyError as exc:
        with diag.log_section("Dropped section", logging.DEBUG):
            diag.log_source_exception(exc)
    markdown = diag.markdown()
    assert "secret detail" not in markdown and "Dropped section" not in markdown
    assert "Exception log" in markdown
    assert "Traceback (most recent call last):" in markdown
    assert "KeyError: 'missing'" in markdown
    assert markdown.count("```") == 2
    assert diag.source_exception is not None


def test_code_blocks_survive_backticks_in_text() -> None:
    diag = _diag(logging.DEBUG)
    diag.log_code("a = '```'", language="python")
    assert diag.markdown() == "````python\na = '```'\n````"
