"""Levels, rules and the package's independence from torch."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from diagnostics import Level, Rule, rules

ROOT = Path(__file__).resolve().parents[3]


def test_import_pulls_in_no_torch_or_onnx() -> None:
    code = (
        "import sys, diagnostics\n"
        "from diagnostics import (Level, Rule, rules, Location, Stack, Diagnostic,\n"
        "    DiagnosticContext, DiagnosticOptions)\n"
        "heavy = [m for m in ('torch', 'onnx', 'onnxscript', 'onnx_ir', 'fx2onnx', 'dispatcher')\n"
        "         if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_sources_name_no_forbidden_import() -> None:
    forbidden = re.compile(r"^\s*(from|import)\s+(torch|onnx|onnxscript|onnx_ir|fx2onnx|dispatcher)\b", re.M)
    for source in (ROOT / "diagnostics").rglob("*.py"):
        assert not forbidden.search(source.read_text()), source


def test_levels_are_ordered_and_map_to_sarif_and_logging() -> None:
    assert Level.NONE < Level.NOTE < Level.WARNING < Level.ERROR
    assert [level.sarif_level for level in Level] == ["none", "note", "warning", "error"]
    assert [level.logging_level for level in Level] == [
        logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR,
    ]
    assert Level.from_sarif("warning") is Level.WARNING
    with pytest.raises(ValueError, match="expected one of none, note, warning, error"):
        Level.from_sarif("fatal")


EXPECTED_CATALOG = {
    "FX_GRAPH_TO_ONNX": ("FXE0007", "fx-graph-to-onnx"),
    "FX_NODE_TO_ONNX": ("FXE0008", "fx-node-to-onnx"),
    "FX_PASS": ("FXE0010", "fx-pass"),
    "NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION": ("FXE0011", "no-symbolic-function-for-call-function"),
    "UNSUPPORTED_FX_NODE_ANALYSIS": ("FXE0012", "unsupported-fx-node-analysis"),
    "OP_LEVEL_VALIDATION": ("FXE0013", "op-level-validation"),
    "FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION": ("FXE0014", "find-opschema-matched-symbolic-function"),
    "FX_NODE_INSERT_TYPE_PROMOTION": ("FXE0015", "fx-node-insert-type-promotion"),
    "FIND_OPERATOR_OVERLOADS_IN_ONNX_REGISTRY": ("FXE0016", "find-operator-overloads-in-onnx-registry"),
    "CAPTURE_FAILURE": ("FXE0017", "capture-failure"),
    "EXPORT_SUMMARY": ("FXE0018", "export-summary"),
    "GRAPH_BUILDING": ("FXE0019", "onnx-graph-building"),
    "TYPE_LEGALIZATION": ("FXE0021", "type-legalization"),
    "MODEL_VALIDATION": ("FXE0022", "onnx-model-validation"),
    "INVALID_MODEL_IO": ("FXE0023", "invalid-model-inputs-or-outputs"),
    "RUNTIME_VERIFICATION": ("FXE0024", "runtime-verification"),
    "ALIASED_EXAMPLE_INPUTS": ("FXE0025", "aliased-example-inputs"),
    "TRAINING_MODE": ("FXE0026", "training-mode-export"),
    "OPTION_WITHOUT_EFFECT": ("FXE0027", "option-without-effect"),
    "CACHE_OUTSIDE_LAYERS": ("FXE0028", "cache-outside-layers"),
}


@pytest.mark.parametrize("constant", sorted(EXPECTED_CATALOG))
def test_catalog_constant_has_fixed_id_name_and_real_texts(constant: str) -> None:
    rule = getattr(rules, constant)
    assert (rule.id, rule.name) == EXPECTED_CATALOG[constant]
    assert rules.by_id(rule.id) is rule
    for text in (rule.short_description, rule.full_description, rule.help_text, rule.message_template):
        assert len(text) > 20, (constant, text)
    # GitHub code scanning caps descriptions at 1024 characters.
    assert len(rule.short_description) <= 1024 and len(rule.full_description) <= 1024


def test_catalog_all_is_complete_and_unique() -> None:
    assert {rule.id for rule in rules.ALL} == {id_ for id_, _ in EXPECTED_CATALOG.values()}
    assert len(rules.ALL) == len(EXPECTED_CATALOG)
    with pytest.raises(KeyError, match="FXE9999"):
        rules.by_id("FXE9999")


def test_specified_templates_and_default_levels() -> None:
    assert rules.FX_GRAPH_TO_ONNX.format_message(graph_name="main") == (
        "Transforming FX graph main to ONNX graph."
    )
    assert rules.FX_NODE_TO_ONNX.format_message(node="add_1") == "Transforming FX node add_1 to ONNX."
    assert rules.FX_PASS.format_message(pass_name="Decompose") == "Running Decompose pass."
    assert rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION.format_message(target="aten::frob.default") == (
        "No ONNX function to convert the call_function node aten::frob.default to ONNX."
    )
    assert rules.UNSUPPORTED_FX_NODE_ANALYSIS.format_message(target="aten::x", reason="no function") == (
        "Unsupported FX node aten::x: no function"
    )
    assert rules.FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION.format_message(
        function="aten_add", match="nearest", target="aten::add.Tensor"
    ) == "The ONNX function aten_add is the nearest match for aten::add.Tensor."
    assert rules.CAPTURE_FAILURE.format_message(reason="boom") == (
        "torch.export could not capture the model: boom"
    )
    assert rules.EXPORT_SUMMARY.format_message(model="Net", summary="12 nodes") == (
        "Exported Net to ONNX: 12 nodes"
    )
    assert rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION.default_level is Level.ERROR
    assert rules.CAPTURE_FAILURE.default_level is Level.ERROR
    assert rules.FX_NODE_TO_ONNX.default_level is Level.NONE


def test_help_texts_say_what_to_do() -> None:
    help_11 = rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION.help_text
    assert "OnnxRegistry.register_op(" in help_11 and "ExportOptions(onnx_registry=" in help_11
    help_17 = rules.CAPTURE_FAILURE.help_text
    # The cause-specific advice is in each message's hint; the help sends the reader there
    # and never prescribes torch.cond for failures that are not control flow.
    for advice in ("hint", "non-strict", "strict", "ExportedProgram"):
        assert advice in help_17
    assert "torch.cond" not in help_17


def test_rule_is_frozen_and_names_missing_template_arguments() -> None:
    rule = Rule("X0001", "x-rule", "short", "full", "Node {node} in {graph.name}.", "help", Level.NOTE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule.id = "X0002"  # type: ignore[misc]
    assert rule.template_fields() == ("node", "graph")
    with pytest.raises(ValueError, match=r"needs the arguments \['graph'\]"):
        rule.format_message(node="add")


def test_the_rule_catalog_in_docs_is_current():
    from pathlib import Path

    from diagnostics.catalog import catalog_markdown

    docs = Path(__file__).resolve().parents[3] / "docs" / "rules.md"
    assert docs.read_text(encoding="utf-8") == catalog_markdown(), "regenerate: python -m diagnostics.catalog > docs/rules.md"
    assert "| an ONNX function whose signature fits the node's argument types exactly | FXE0014 | none |" in docs.read_text()
