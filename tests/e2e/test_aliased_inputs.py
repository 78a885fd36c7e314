"""End-to-end: example inputs that share storage are exported as independent inputs.

Each model is exported from aliased examples and run, through `program(...)` and in
onnxruntime on the saved file, with distinct values, against PyTorch.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

import fx2onnx
from conftest import assert_outputs_close, check_saved_model, export_program


class QueryKey(nn.Module):
    def forward(self, q, k):
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1)


class ReadsWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 3))

    def forward(self, x):
        return x @ self.weight + 1


def _run_saved(program: fx2onnx.ONNXProgram, path, *inputs: torch.Tensor) -> list[np.ndarray]:
    check_saved_model(program, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {name: t.numpy() for name, t in zip(names, inputs)})


def _aliasing_notes(program: fx2onnx.ONNXProgram) -> list[str]:
    return [d.message for d in program.diagnostics if d.rule.id == "FXE0025"]


@pytest.mark.parametrize(
    ("model", "example", "run"),
    [
        pytest.param(lambda a, b: a + b, "same", "distinct", id="same-tensor-twice-function"),
        pytest.param(QueryKey(), "same", "distinct", id="same-tensor-twice-module"),
        pytest.param(lambda a, b: a * 2 + b.sum(0), "view", "distinct", id="view-of-another-input"),
    ],
)
def test_aliased_examples_are_independent_inputs(model, example, run, tmp_path):
    x = torch.randn(4, 3)
    before = x.clone()
    inputs = (x, x) if example == "same" else (x, x[1:3])
    program = export_program(model, inputs, tmp_path=tmp_path)
    assert torch.equal(x, before), "the user's example tensors are left as they are"
    assert len(program.model.graph.inputs) == 2
    distinct = (torch.randn(*inputs[0].shape), torch.randn(*inputs[1].shape))
    expected = model(*distinct)
    assert_outputs_close(program(*distinct), expected)
    (from_file,) = _run_saved(program, tmp_path / "m.onnx", *distinct)
    torch.testing.assert_close(torch.from_numpy(from_file), expected, rtol=1e-5, atol=1e-5)
    # the acceptance case: one input, then a distinct value for the other
    if example == "same":
        assert_outputs_close(program(x, x + 1), model(x, x + 1))
    assert any("'a' and 'b'" in m or "'q' and 'k'" in m for m in _aliasing_notes(program)), _aliasing_notes(program)


def test_input_that_is_a_parameter_is_an_independent_input(tmp_path):
    model = ReadsWeight().eval()
    program = export_program(model, (model.weight.detach(),), tmp_path=tmp_path)
    other = torch.randn(3, 3)
    with torch.no_grad():
        expected = model(other)
    assert_outputs_close(program(other), expected)
    (from_file,) = _run_saved(program, tmp_path / "m.onnx", other)
    torch.testing.assert_close(torch.from_numpy(from_file), expected, rtol=1e-5, atol=1e-5)
    assert any("the model's 'weight'" in m for m in _aliasing_notes(program))


def test_in_place_update_seen_through_an_alias_is_a_warning(tmp_path):
    def update_then_read(a, b):
        a.add_(1)
        return b * 2

    x = torch.randn(2, 3)
    before = x.clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = export_program(update_then_read, (x, x), tmp_path=tmp_path)
    assert torch.equal(x, before)
    texts = [str(w.message) for w in caught if issubclass(w.category, fx2onnx.ExportWarning)]
    assert any("FXE0025" in t and "updates 'a' in place" in t and ".clone()" in t for t in texts), texts
    (warning,) = [d for d in program.diagnostics if d.rule.id == "FXE0025"]
    assert warning.level.name == "WARNING"
    # what the model computes on independent tensors
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    assert_outputs_close(program(a.clone(), b), update_then_read(a.clone(), b))


def test_independent_examples_get_no_note(tmp_path):
    program = export_program(lambda a, b: a + b, (torch.randn(2), torch.randn(2)), tmp_path=tmp_path)
    assert _aliasing_notes(program) == []


def test_aliased_fake_examples_are_independent_inputs(tmp_path):
    with fx2onnx.enable_fake_mode() as fake_context:
        x = torch.randn(2, 3)
    options = fx2onnx.ExportOptions(fake_context=fake_context, failure_report_path=None)
    program = fx2onnx.dynamo_export(lambda a, b: a - b, x, x, export_options=options)
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    assert_outputs_close(program(a, b), a - b)
    assert _aliasing_notes(program)
