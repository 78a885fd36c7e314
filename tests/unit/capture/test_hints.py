"""Each kind of capture failure gets its own hint, and the message keeps what explains it."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import fx2onnx
from diagnostics import rules
from fx2onnx.capture.hints import HINTS, CaptureFailure, capture_hint, classify, explain
from fx2onnx.capture.value_branches import value_branch
from sarif_checks import validate_sarif

THIS_FILE = __file__


def line_of(marker: str) -> int:
    for number, line in enumerate(inspect.getsource(inspect.getmodule(line_of)).splitlines(), 1):
        if f"# {marker}" in line:
            return number
    raise AssertionError(marker)


class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)


class FixedBatch(torch.nn.Module):
    def forward(self, x):
        return x.reshape(2, -1)  # specializes the batch


class Branchy(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x + 1
        return x - 1


def _meta_model() -> torch.nn.Module:
    with torch.device("meta"):
        return Linear()


def _failure(tmp_path, model, *args, dynamic_shapes=None, **kwargs) -> fx2onnx.OnnxExporterError:
    report = tmp_path / "hint.sarif"
    options = fx2onnx.ExportOptions(dynamic_shapes=dynamic_shapes, failure_report_path=report)
    with pytest.raises(fx2onnx.OnnxExporterError) as caught:
        fx2onnx.dynamo_export(model, *args, export_options=options, **kwargs)
    validate_sarif(report)
    return caught.value


X = torch.randn(2, 4)

# kind -> (model, args, dynamic_shapes, words the hint must contain)
CASES = {
    "not-a-model": (42, (X,), None, ("nn.Module instance", "plain function", "ExportedProgram")),
    "numpy-input": (Linear(), (np.ones((2, 4), np.float32),), None, ("torch.from_numpy",)),
    "meta-weights": (_meta_model, (X,), None, ("meta device", "fc.weight", "to_empty", "enable_fake_mode", "model_state")),
    "argument-count": (Linear(), (X, X), None, ("forward(x)", "2 positional input(s)", "too many positional")),
    "dynamic-shapes-spec": (Linear(), (X,), {"y": {0: torch.export.Dim("b")}}, ("forward(x)", "parameter names", "dynamic_shapes=True")),
    "constraints-violated": (FixedBatch(), (torch.randn(2, 3),), {"x": {0: torch.export.Dim("b")}}, ("static", "Dim.AUTO")),
    "data-dependent": (Branchy(), (X,), None, ("torch.cond", "torch._check")),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_each_capture_failure_gets_the_hint_of_its_cause(tmp_path, kind):
    model, args, dynamic_shapes, words = CASES[kind]
    model = model() if callable(model) and not isinstance(model, torch.nn.Module) else model
    error = _failure(tmp_path, model, *args, dynamic_shapes=dynamic_shapes)
    (diagnostic,) = error.diagnostic_context.errors()
    assert diagnostic.rule.id == rules.CAPTURE_FAILURE.id
    hint = diagnostic.message.split("Hint: ", 1)[1]
    for word in words:
        assert word in hint, (word, hint)
    if kind != "data-dependent":  # control flow is not the cause: never advise torch.cond
        assert "torch.cond" not in str(error)
    # Never the advice of another rule (register an ONNX function) for a capture problem.
    assert "register_op" not in str(error)
    # The failure points at the user's code (this file, or the tests' shared export helper
    # that calls the exporter), never at fx2onnx or torch.
    assert diagnostic.location is not None
    assert Path(diagnostic.location.path) in (Path(THIS_FILE), Path(THIS_FILE).parents[2] / "conftest.py")


def test_a_class_instead_of_an_instance(tmp_path):
    error = _failure(tmp_path, Linear, X)
    assert "Linear is a class: pass an instance, e.g. dynamo_export(Linear(), ...)" in str(error)


def test_constraint_violations_keep_their_explanation(tmp_path):
    error = _failure(tmp_path, FixedBatch(), torch.randn(2, 3), dynamic_shapes={"x": {0: torch.export.Dim("b")}})
    text = str(error)
    assert "Constraints violated (b)" in text
    assert "You marked b as dynamic but your code specialized it to be a constant (2)" in text
    assert "Suggested fixes:" in text and "b = 2" in text
    assert "draft_export" not in text and "User stack" not in text  # boilerplate and stack dropped
    # torch.export names the line only in its message's user stack: the report points there.
    (diagnostic,) = error.diagnostic_context.errors()
    assert (diagnostic.location.path, diagnostic.location.line) == (THIS_FILE, line_of("specializes the batch"))


def test_cache_outputs_say_what_to_change():
    # The texts torch.export gives (non-strict, then strict) for a transformers cache output.
    for text in (
        "Found <class 'transformers.cache_utils.DynamicCache'> in output, which is not a known type.",
        "Encountered unrecognized type UserDefinedObjectVariable(DynamicCache) at output 1",
    ):
        failure = CaptureFailure(RuntimeError(text), Linear(), (X,))
        assert classify(failure).kind == "cache-output"
        hint = capture_hint(failure)
        assert "use_cache = False" in hint and "past_key_values" in hint and "torch.cond" not in hint


def test_other_unknown_output_types_name_the_type():
    failure = CaptureFailure(RuntimeError("Found <class 'mylib.Boxes'> in output, which is not a known type."))
    assert classify(failure).kind == "unknown-output-type"
    assert "mylib.Boxes" in capture_hint(failure) and "register_pytree_node" in capture_hint(failure)


def test_every_hint_kind_is_pinned_by_a_test():
    tested = set(CASES) | {"cache-output", "unknown-output-type", "needs-real-data", "untraceable", "fake-mode-use", "inside-torch-export"}
    assert {hint.kind for hint in HINTS} == tested


def test_fake_inputs_without_a_fake_context(tmp_path):
    with fx2onnx.enable_fake_mode():
        x = torch.randn(2, 4)
    error = _failure(tmp_path, Linear(), x)
    (diagnostic,) = error.diagnostic_context.errors()
    assert diagnostic.rule.id == rules.CAPTURE_FAILURE.id
    assert "ExportOptions(fake_context=fake_context)" in diagnostic.message.split("Hint: ", 1)[1]
    assert "register_op" not in str(error) and "torch.cond" not in str(error)


def test_untraceable_calls_and_unknown_causes():
    assert classify(CaptureFailure(RuntimeError("Cannot access data pointer of Tensor"))).kind == "needs-real-data"
    generic = CaptureFailure(RuntimeError("something torch.export could not do"))
    assert classify(generic).kind == "untraceable"
    assert "torch.cond" not in capture_hint(generic)


def test_explain_keeps_the_first_paragraph_and_the_fixes():
    error = RuntimeError(
        "Constraints violated (c)! For more information, run with TORCH_LOGS=\"+dynamic\".\n"
        "  - The values of c = L['y'].size()[0] and b = L['x'].size()[0] must always be equal.\n"
        "\nUser stack:\n  File \"/x.py\", line 3, in forward\n    return x + y\n\n"
        "Suggested fixes:\n  c = b\n\n"
        "The error above occurred when calling torch.export.export. If you would like ..."
    )
    assert explain(error) == (
        "RuntimeError: Constraints violated (c)! For more information, run with TORCH_LOGS=\"+dynamic\".\n"
        "  - The values of c = L['y'].size()[0] and b = L['x'].size()[0] must always be equal.\n"
        "Suggested fixes:\n  c = b"
    )
    guard = RuntimeError(
        "Could not guard on data-dependent expression u0 > 2 (unhinted: u0 > 2).\n\n"
        "consider using data-dependent friendly APIs such as guard_or_false.\n"
        "Caused by: return torch.zeros(n) if n > 2 else x  # model.py:6 in forward\n"
        "For more information, run with TORCH_LOGS=\"dynamic\"\n\n"
        "User Stack (most recent call last):\n  File \"/model.py\", line 6, in forward\n"
    )
    assert explain(guard) == (
        "RuntimeError: Could not guard on data-dependent expression u0 > 2 (unhinted: u0 > 2).\n"
        "Caused by: return torch.zeros(n) if n > 2 else x  # model.py:6 in forward"
    )
    assert explain(ValueError("")) == "ValueError: (no message)"


# -- plain functions as models ---------------------------------------------------------------


def branchy_function(x):
    if x.sum() > 0:  # function branch
        return x + 1
    return x - 1


@torch.library.custom_op("fx2onnx_hint_tests::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def function_with_unsupported_op(x):
    y = x + 1
    return twice(y)  # unsupported in a function


def test_a_plain_function_is_reported_at_the_users_line(tmp_path):
    error = _failure(tmp_path, branchy_function, X)
    (diagnostic,) = error.diagnostic_context.errors()
    assert (diagnostic.location.path, diagnostic.location.line) == (THIS_FILE, line_of("function branch"))

    error = _failure(tmp_path, function_with_unsupported_op, X)
    (diagnostic,) = error.diagnostic_context.errors()
    assert diagnostic.rule.id == rules.UNSUPPORTED_FX_NODE_ANALYSIS.id
    assert (diagnostic.location.path, diagnostic.location.line) == (THIS_FILE, line_of("unsupported in a function"))
    assert "Exporting function_with_unsupported_op to ONNX failed" in error.diagnostic_context.to_json()


def scale_and_shift(x, y, *, shift: float = 1.0):
    return x * y + shift


def test_a_plain_function_exports_with_named_dynamic_dims(export_and_compare):
    batch = torch.export.Dim("batch")
    options = fx2onnx.ExportOptions(dynamic_shapes={"x": {0: batch}, "y": {0: batch}}, failure_report_path=None)
    program = export_and_compare(
        scale_and_shift, (torch.randn(2, 3), torch.randn(2, 3)), options=options,
        second_inputs=((torch.randn(5, 3), torch.randn(5, 3)), {}),
    )
    assert [str(d) for d in program.model.graph.inputs[0].shape] == ["batch", "3"]


class KeywordCache(torch.nn.Module):
    """A forward that renamed its cache argument: the old name lands in **kwargs."""

    def forward(self, x, cache=None, **kwargs):
        return x


def _torch_internal_error() -> AssertionError:
    """The assertion torch.export (2.13) raised for inputs in **kwargs with a dynamic spec."""
    from torch.export.dynamic_shapes import _tree_map_with_path

    try:
        _tree_map_with_path(lambda path, t, spec: None, {"a": torch.ones(1)}, {"b": None})
    except AssertionError as error:
        return error
    pytest.fail("torch no longer asserts here: pick another internal assertion for this test")


def test_failures_inside_torch_export_name_what_fx2onnx_knows():
    error = _torch_internal_error()
    failure = CaptureFailure(error, KeywordCache(), (torch.ones(2),), {"past_key_values": torch.ones(2)}, True)
    assert classify(failure).kind == "inside-torch-export"
    hint = capture_hint(failure)
    assert "not a line of your code" in hint and "torch/export/dynamic_shapes.py:" in hint
    assert f"torch {torch.__version__.split('+')[0]}" in hint
    assert "cache= " in hint and "past_key_values=" in hint
    assert "ExportOptions(dynamic_shapes=False)" in hint
    assert "fix the line" not in hint
    static = capture_hint(CaptureFailure(error, Linear(), (torch.ones(2, 4),), {}, None))
    assert "dynamic_shapes=False" not in static and "cache=" not in static


def test_tested_versions_are_the_pinned_ones():
    from fx2onnx.capture.hints import TESTED_WITH

    pins = dict(
        line.strip().split("==", 1)
        for line in (Path(__file__).resolve().parents[3] / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    assert {name: pins[name] for name in TESTED_WITH} == TESTED_WITH


# -- the model's line of a branch on tensor values ------------------------------------------


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
    """The failure and the text of its error in the SARIF report."""
    error = _failure(tmp_path, model, X)
    results = [r for run in json.loads((tmp_path / "hint.sarif").read_text())["runs"] for r in run["results"]]
    (result,) = [r for r in results if r["level"] == "error"]
    return error, result["message"]["text"]


def test_the_hint_and_report_name_the_models_line(tmp_path: Path) -> None:
    error, reported = _failed(tmp_path, BranchesOnItem())
    line = line_of("item branch")
    named = f"test_hints.py:{line} in half (`if x.sum().item() > 0:  # item branch`)"
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
