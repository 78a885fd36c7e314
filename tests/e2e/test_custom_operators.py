"""Custom operators end to end: torch.library op -> user ONNX Script function -> onnxruntime."""

from __future__ import annotations

import math

import onnx
import onnxscript
import pytest
import torch
from onnxscript import FLOAT, opset18 as op

import fx2onnx
from conftest import ATOL, RTOL


@torch.library.custom_op("fx2onnx_tests::fused_gelu", mutates_args=())
def fused_gelu(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh")


@fused_gelu.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@onnxscript.script(opset=op)
def fused_gelu_onnx(x: FLOAT) -> FLOAT:
    # tanh approximation of GELU, written with standard ONNX ops
    inner = op.Mul(op.Constant(value_float=math.sqrt(2.0 / math.pi)), op.Add(x, op.Mul(op.Constant(value_float=0.044715), op.Pow(x, op.Constant(value_float=3.0)))))
    return op.Mul(op.Mul(op.Constant(value_float=0.5), x), op.Add(op.Constant(value_float=1.0), op.Tanh(inner)))


example_domain = onnxscript.values.Opset("com.example", 1)


@onnxscript.script(opset=op)
def fused_gelu_custom_domain(x: FLOAT) -> FLOAT:
    return example_domain.FastGelu(x)


class GeluModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_gelu(self.linear(x))


def _options(registry: fx2onnx.OnnxRegistry, tmp_path) -> fx2onnx.ExportOptions:
    return fx2onnx.ExportOptions(onnx_registry=registry, failure_report_path=tmp_path / "report.sarif")


def _all_nodes(model: onnx.ModelProto):
    yield from model.graph.node
    for function in model.functions:
        yield from function.node


def test_custom_operator_without_registration_fails_naming_it(tmp_path):
    with pytest.raises(fx2onnx.OnnxExporterError, match="fx2onnx_tests::fused_gelu"):
        fx2onnx.dynamo_export(GeluModel().eval(), torch.randn(2, 8), export_options=_options(fx2onnx.OnnxRegistry(), tmp_path))


def test_custom_operator_exports_through_user_function_and_matches(tmp_path):
    registry = fx2onnx.OnnxRegistry()
    registry.register_op(fused_gelu_onnx, "fx2onnx_tests", "fused_gelu")
    model = GeluModel().eval()
    x = torch.randn(3, 8)
    program = fx2onnx.dynamo_export(model, x, export_options=_options(registry, tmp_path))
    path = tmp_path / "gelu.onnx"
    program.save(path)
    onnx.checker.check_model(str(path), full_check=True)
    torch.testing.assert_close(program(x), model(x).detach(), rtol=RTOL, atol=ATOL)
    # the user's function is called as a model-local function in its own domain
    proto = program.model_proto
    assert any(f.name == "fused_gelu_onnx" for f in proto.functions)
    assert any(n.op_type == "fused_gelu_onnx" for n in _all_nodes(proto))


def test_custom_operator_can_emit_a_node_in_a_custom_domain(tmp_path):
    registry = fx2onnx.OnnxRegistry()
    registry.register_op(fused_gelu_custom_domain, "fx2onnx_tests", "fused_gelu")
    program = fx2onnx.dynamo_export(GeluModel().eval(), torch.randn(2, 8), export_options=_options(registry, tmp_path))
    proto = program.model_proto
    fast_gelu = [n for n in _all_nodes(proto) if n.op_type == "FastGelu"]
    assert len(fast_gelu) == 1 and fast_gelu[0].domain == "com.example"
    assert "com.example" in {o.domain for o in proto.opset_import}
    onnx.checker.check_model(proto)


@onnxscript.script(opset=op)
def add_then_double(self: FLOAT, other: FLOAT, alpha: float = 1.0) -> FLOAT:
    # a deliberately different semantics so the override is visible in the numbers
    return op.Mul(op.Add(self, op.Mul(other, alpha)), op.Constant(value_float=2.0))


def test_user_function_overrides_an_aten_operator(tmp_path):
    class AddModel(torch.nn.Module):
        def forward(self, x, y):
            return x + y

    registry = fx2onnx.OnnxRegistry()
    registry.register_op(add_then_double, "aten", "add", "Tensor")
    x, y = torch.randn(4), torch.randn(4)
    program = fx2onnx.dynamo_export(AddModel(), x, y, export_options=_options(registry, tmp_path))
    torch.testing.assert_close(program(x, y), (x + y) * 2)
