"""ExportOptions(verify=True): the exported model runs once in onnxruntime on the example
inputs; a runtime failure or a mismatch with PyTorch fails the export with FXE0024 at the
ONNX node, the FX node and the user's line."""

from __future__ import annotations

import inspect

import pytest
import torch
from onnxscript import FLOAT, opset18 as op
import onnxscript

import fx2onnx
from diagnostics import Level, rules
from conftest import make_options
from sarif_checks import validate_sarif


@onnxscript.script(opset=op)
def conv_with_2d_zero_bias(input: FLOAT, weight: FLOAT) -> FLOAT:
    # a bias of shape [out, 2]: ONNX accepts the model, onnxruntime refuses to run it
    bias_shape = op.Concat(op.Shape(weight, start=0, end=1), op.Constant(value_ints=[2]), axis=0)
    bias = op.Expand(op.CastLike(op.Constant(value_float=0.0), input), bias_shape)
    return op.Conv(input, weight, bias)


@onnxscript.script(opset=op)
def doubled_relu(x: FLOAT) -> FLOAT:
    return op.Mul(op.Relu(x), op.Constant(value_float=2.0))


class Video(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(3, 4, 3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x)) + 1  # LINE-USER


def _user_line() -> int:
    source, start = inspect.getsourcelines(Video.forward)
    return start + next(i for i, line in enumerate(source) if "LINE-USER" in line)


def _registry(op_name: str, function) -> fx2onnx.OnnxRegistry:
    registry = fx2onnx.OnnxRegistry()
    registry.register_op(function, "aten", op_name)
    return registry


def _export(tmp_path, registry=None, verify=True) -> fx2onnx.ONNXProgram:
    options = make_options(tmp_path, verify=verify, onnx_registry=registry)
    return fx2onnx.dynamo_export(Video().eval(), torch.rand(1, 3, 4, 6, 6), export_options=options)


def _verification_error(error: fx2onnx.OnnxExporterError):
    (diagnostic,) = [d for d in error.diagnostic_context.errors() if d.rule is rules.RUNTIME_VERIFICATION]
    return diagnostic


def test_a_verified_export_records_its_largest_difference(tmp_path):
    program = _export(tmp_path)
    notes = [d for d in program.diagnostic_context.diagnostics if d.rule is rules.RUNTIME_VERIFICATION]
    assert [d.level for d in notes] == [Level.NOTE] and "largest difference" in notes[0].message
    assert "verification" in program.stage_seconds


def test_a_model_onnxruntime_refuses_fails_the_export_at_its_node(tmp_path):
    registry = _registry("conv3d", conv_with_2d_zero_bias)
    unverified = _export(tmp_path / "plain", registry, verify=False)  # valid ONNX...
    with pytest.raises(Exception, match="bias must be a 1D tensor"):
        unverified(torch.rand(1, 3, 4, 6, 6))  # ... that onnxruntime refuses
    with pytest.raises(fx2onnx.OnnxExporterError) as raised:
        _export(tmp_path / "verified", registry)
    diagnostic = _verification_error(raised.value)
    assert "Conv" in diagnostic.properties["op_type"]
    assert diagnostic.properties["fx_node"].startswith("conv3d")
    assert "bias must be a 1D tensor" in diagnostic.message and "FXE0024" in str(raised.value)
    validate_sarif(tmp_path / "verified" / "r.sarif")


def test_a_mismatch_names_the_first_node_that_differs_and_the_users_line(tmp_path):
    with pytest.raises(fx2onnx.OnnxExporterError) as raised:
        _export(tmp_path, _registry("relu", doubled_relu))
    diagnostic = _verification_error(raised.value)
    assert diagnostic.properties["fx_node"] == "relu"
    assert "differ from PyTorch" in diagnostic.message
    assert diagnostic.location is not None and diagnostic.location.line == _user_line()


def test_fake_inputs_are_not_verified(tmp_path):
    with fx2onnx.enable_fake_mode() as fake_context:
        model = Video().eval()
        x = torch.rand(1, 3, 4, 6, 6)
    options = make_options(tmp_path, verify=True, fake_context=fake_context)
    program = fx2onnx.dynamo_export(model, x, export_options=options)
    (note,) = [d for d in program.diagnostic_context.diagnostics if d.rule is rules.RUNTIME_VERIFICATION]
    assert note.level is Level.NOTE and "fake" in note.message


def test_verification_leaves_the_models_buffers_as_they_were(tmp_path):
    model = torch.nn.BatchNorm1d(4).train()  # training mode: running statistics update
    before = {name: buffer.clone() for name, buffer in model.named_buffers()}
    fx2onnx.dynamo_export(model, torch.randn(5, 4), export_options=make_options(tmp_path, verify=True))
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, before[name]), name
