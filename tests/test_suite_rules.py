"""The suite's own rules hold and can fail: every export passes the full ONNX checker
whatever the scope of the fixture that makes it, and a run's summary counts its skipped
tests by reason (modules skipped at collection with the test functions they hold)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import onnx
import pytest
import torch

import conftest
import fx2onnx


@pytest.fixture(scope="module")
def module_scoped_export() -> tuple[object, fx2onnx.ONNXProgram]:
    return fx2onnx.dynamo_export, fx2onnx.dynamo_export(conftest.MLP().eval(), torch.randn(2, 8))


def test_exports_in_module_scoped_fixtures_are_checked(module_scoped_export) -> None:
    export, program = module_scoped_export
    assert export is conftest.checked_export
    assert program.model_proto.graph.node


def test_the_check_fails_on_an_invalid_model(monkeypatch) -> None:
    """A planted fault: an export whose model has a node of an operator no opset defines."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("NoSuchOperator", ["x"], ["y"])], "planted",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    invalid = SimpleNamespace(model_proto=onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)]))
    monkeypatch.setattr(conftest, "_unchecked_export", lambda *args, **kwargs: invalid)
    with pytest.raises(onnx.checker.ValidationError, match="NoSuchOperator"):
        fx2onnx.dynamo_export(conftest.MLP(), torch.randn(2, 8))


class _Reporter:
    def __init__(self, stats: dict, root: Path) -> None:
        self.stats, self.config, self.lines = stats, SimpleNamespace(rootpath=root), []

    def write_sep(self, sep: str, title: str) -> None:
        self.lines.append(title)

    def write_line(self, line: str) -> None:
        self.lines.append(line)


def test_the_summary_counts_skips_by_reason(tmp_path) -> None:
    (tmp_path / "test_needs_gpu.py").write_text("def test_a():\n    pass\n\n\ndef test_b():\n    pass\n\n\ndef helper():\n    pass\n")
    skipped = [
        pytest.TestReport(f"t.py::{name}", ("t.py", 1, name), {}, "skipped", ("t.py", 1, f"Skipped: {reason}"), "call")
        for name, reason in (("a", "no network"), ("b", "no network"), ("c", "slow"))
    ]
    skipped.append(pytest.CollectReport("test_needs_gpu.py", "skipped", ("test_needs_gpu.py", 3, "Skipped: no GPU"), []))
    reporter = _Reporter({"skipped": skipped}, tmp_path)
    conftest.pytest_terminal_summary(reporter)
    assert reporter.lines == [
        "skipped, by reason", "2 test(s): no network", "1 test(s): slow",
        "1 module(s) not collected, 2 test functions in them: no GPU",
    ]
