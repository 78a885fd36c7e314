"""Dims asked to be dynamic whose example size is 1: the model is captured from its example
repeated to size 2 there; where only torch's own code compares them (a kernel choosing
its implementation by the batch), that capture is kept and the dim stays dynamic; where
the model's code compares them, the dim is fixed and the warning says so."""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch

import fx2onnx

from conftest import export_and_compare_impl, make_options

KERNEL_CHOICE = '''
import pytest
import torch

import fx2onnx


def pick(x, weight):
    # an implementation chosen by the batch, as torch's kernels choose memory formats
    if x.shape[0] <= 1:
        return torch.nn.functional.conv2d(x, weight, padding=1)
    return torch.nn.functional.conv2d(x.contiguous(), weight, padding=1)
'''


def _module_in(folder, name: str):
    folder.mkdir(parents=True)
    path = folder / f"{name}.py"
    path.write_text(KERNEL_CHOICE)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Convolution(torch.nn.Module):
    def __init__(self, pick) -> None:
        super().__init__()
        self.pick = pick
        self.weight = torch.nn.Parameter(torch.randn(4, 3, 3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pick(x, self.weight).relu()


def test_a_batch_of_one_compared_only_by_torch_stays_dynamic(tmp_path):
    kernel = _module_in(tmp_path / "site-packages" / "torch", "kernel_choice")  # a file of torch's, as far as paths tell
    model = Convolution(kernel.pick).eval()
    options = make_options(tmp_path, dynamic_shapes=True)
    program = export_and_compare_impl(model, (torch.randn(1, 3, 8, 8),), options=options, tmp_path=tmp_path,
                                      second_inputs=((torch.randn(3, 3, 10, 10),), {}))
    assert str(program.model.graph.inputs[0].shape[0]) == "x_dim_0"
    notes = [d.message for d in program.diagnostic_context.diagnostics if "repeated to size 2" in (d.message or "")]
    assert len(notes) == 1 and "dim 0 of input 'x'" in notes[0]
    assert not program.warnings


def test_a_batch_compared_only_by_torch_takes_one_capture(tmp_path, monkeypatch):
    """Every dim is dynamic, but only the batch has size 1: the grown example is captured
    once with every dim dynamic, and its guards show that only torch's code compares the
    batch; the example itself is never captured."""
    kernel = _module_in(tmp_path / "site-packages" / "torch", "kernel_choice")
    model = Convolution(kernel.pick).eval()
    captures = []
    export = torch.export.export

    def spy(model, args, kwargs=None, *, dynamic_shapes=None, **rest):
        captures.append((args[0].shape[0], sorted(dynamic_shapes["x"] or {})))
        return export(model, args, kwargs, dynamic_shapes=dynamic_shapes, **rest)

    monkeypatch.setattr(torch.export, "export", spy)
    program = export_and_compare_impl(model, (torch.randn(1, 3, 8, 8),), options=make_options(tmp_path, dynamic_shapes=True),
                                      tmp_path=tmp_path, second_inputs=((torch.randn(2, 3, 6, 10),), {}))
    assert captures == [(2, [0, 1, 2, 3])]
    assert [str(d) for d in program.model.graph.inputs[0].shape] == ["x_dim_0", "3", "x_dim_2", "x_dim_3"]


def test_a_batch_of_one_compared_by_the_models_code_is_fixed_with_a_warning(tmp_path, monkeypatch):
    kernel = _module_in(tmp_path / "project", "model_code")
    model = Convolution(kernel.pick).eval()
    captured_batches = []
    export = torch.export.export

    def spy(model, args, kwargs=None, **rest):
        captured_batches.append(args[0].shape[0])
        return export(model, args, kwargs, **rest)

    monkeypatch.setattr(torch.export, "export", spy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = export_and_compare_impl(model, (torch.randn(1, 3, 8, 8),), options=make_options(tmp_path, dynamic_shapes=True),
                                          tmp_path=tmp_path)
    assert program.model.graph.inputs[0].shape[0] == 1
    assert any("dim 0 of input 'x' was fixed to 1" in str(w.message) for w in caught)
    # the grown capture showed the model's comparison; the example itself was captured next
    assert captured_batches[0] == 2 and captured_batches[1:] and set(captured_batches[1:]) == {1}
    assert not [d for d in program.diagnostic_context.diagnostics if "repeated to size 2" in (d.message or "")]


def test_a_named_batch_dim_of_one_compared_only_by_torch_stays_dynamic(tmp_path):
    kernel = _module_in(tmp_path / "site-packages" / "torch", "kernel_choice")
    model = Convolution(kernel.pick).eval()
    options = make_options(tmp_path, dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    program = export_and_compare_impl(model, (torch.randn(1, 3, 8, 8),), options=options, tmp_path=tmp_path,
                                      second_inputs=((torch.randn(3, 3, 8, 8),), {}))
    assert str(program.model.graph.inputs[0].shape[0]) == "batch"
    assert program.model.graph.inputs[0].shape[2] == 8  # the dims not named stay static
    assert any("repeated to size 2" in (d.message or "") for d in program.diagnostic_context.diagnostics)


def test_a_named_batch_dim_of_one_compared_by_the_models_code_is_refused(tmp_path):
    kernel = _module_in(tmp_path / "project", "model_code")
    model = Convolution(kernel.pick).eval()
    options = make_options(tmp_path, dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    with pytest.raises(fx2onnx.OnnxExporterError, match=r"compares it at \S*model_code.py:\d+"):
        fx2onnx.dynamo_export(model, torch.randn(1, 3, 8, 8), export_options=options)


class DoubleASingleRow(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:  # size-oblivious reasoning decides this without a guard at size 2
            return x * 2
        return x + 1


def test_a_named_batch_compared_with_one_by_the_models_code_is_refused_not_captured_grown(tmp_path):
    """The grown example (batch 2) takes the other branch: its capture must not stand in
    for the example's, whichever mode captured it."""
    options = make_options(tmp_path, dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    with pytest.raises(fx2onnx.OnnxExporterError, match=r"compares it at \S*test_size_one_dims.py:\d+"):
        fx2onnx.dynamo_export(DoubleASingleRow(), torch.randn(1, 3), export_options=options)


def test_a_batch_compared_with_one_by_the_models_code_is_fixed_and_equal_at_the_example(tmp_path):
    program = export_and_compare_impl(DoubleASingleRow(), (torch.randn(1, 3),), options=make_options(tmp_path, dynamic_shapes=True),
                                      tmp_path=tmp_path)
    assert program.model.graph.inputs[0].shape[0] == 1
