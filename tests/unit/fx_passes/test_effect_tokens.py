"""Operators with side effects (ordered by torch.export's effect tokens) and what the user
gives: the wrapped operators export as ordinary nodes, tokens never reach ONNX, and
exporting never edits the user's ExportedProgram or GraphModule."""

from __future__ import annotations

import onnxscript
import pytest
import torch
from onnxscript import FLOAT, opset18 as op
from torch._higher_order_ops import effects
from torch.fx.experimental.proxy_tensor import make_fx

import fx2onnx
from conftest import assert_outputs_close, make_options
from sarif_checks import validate_sarif


@torch.library.custom_op("fx2onnx_tests::ordered_scale", mutates_args=())
def ordered_scale(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@ordered_scale.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


# PyTorch keeps the order of this operator's calls with an effect token.
effects._register_effectful_op(torch.ops.fx2onnx_tests.ordered_scale.default, effects._EffectType.ORDERED)


@onnxscript.script(opset=op)
def ordered_scale_onnx(x: FLOAT) -> FLOAT:
    return op.Mul(x, op.Constant(value_float=3.0))


class Ordered(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.fx2onnx_tests.ordered_scale(x) + torch.ops.fx2onnx_tests.ordered_scale(x * 2)


def _tokenized_program(x: torch.Tensor) -> torch.export.ExportedProgram:
    program = torch.export.export(Ordered(), (x,)).run_decompositions({})
    kinds = {spec.kind.name for spec in program.graph_signature.input_specs}
    assert "TOKEN" in kinds, "the decomposed program should thread an effect token"
    return program


def test_effectful_operator_exports_without_tokens(tmp_path) -> None:
    x = torch.randn(3, 4)
    registry = fx2onnx.OnnxRegistry()
    registry.register_op(ordered_scale_onnx, "fx2onnx_tests", "ordered_scale")
    program = fx2onnx.dynamo_export(
        _tokenized_program(x), x, export_options=make_options(tmp_path, onnx_registry=registry)
    )
    proto = program.model_proto
    assert [i.name for i in proto.graph.input] == ["x"]
    assert len(proto.graph.output) == 1
    sample = torch.randn(3, 4)
    assert_outputs_close(program(sample), Ordered()(sample))


def test_effectful_operator_without_function_is_reported_by_name(tmp_path) -> None:
    x = torch.randn(3, 4)
    with pytest.raises(fx2onnx.OnnxExporterError) as caught:
        fx2onnx.dynamo_export(_tokenized_program(x), x, export_options=make_options(tmp_path))
    assert "fx2onnx_tests::ordered_scale" in str(caught.value)
    assert "TOKEN" not in str(caught.value)
    validate_sarif(tmp_path / "r.sarif")


class Inverse(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.inv(x) + 1


def test_linalg_check_is_dropped(tmp_path) -> None:
    """linalg.inv decomposes into linalg_inv_ex plus an effectful runtime check: the check
    and its token are dropped, the inverse is computed."""
    x = torch.randn(3, 3) + 3 * torch.eye(3)
    program = fx2onnx.dynamo_export(Inverse(), x, export_options=make_options(tmp_path))
    nodes = " ".join(f"{n.domain}::{n.op_type}" for n in program.model_proto.graph.node)
    assert "check_errors" not in nodes and "TOKEN" not in nodes.upper()
    assert_outputs_close(program(x), Inverse()(x))


def test_exporting_leaves_the_users_exported_program_unchanged(tmp_path) -> None:
    class Mixed(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.ops.aten.add.Tensor(x, y)  # int64 + float32: a cast is inserted

    inputs = (torch.randn(3, 3), torch.ones(3, 3, dtype=torch.int64))
    program = torch.export.export(Mixed(), inputs).run_decompositions({})
    before = str(program.graph)
    onnx_program = fx2onnx.dynamo_export(program, *inputs, export_options=make_options(tmp_path))
    assert "Cast" in {node.op_type for node in onnx_program.model_proto.graph.node}
    assert str(program.graph) == before
    assert_outputs_close(program.module()(*inputs), Mixed()(*inputs))


def test_exporting_leaves_the_users_graph_module_unchanged(tmp_path) -> None:
    def mixed(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.add.Tensor(x, y)  # int64 + float32: a cast is inserted

    inputs = (torch.randn(3, 3), torch.ones(3, 3, dtype=torch.int64))
    graph_module = make_fx(mixed)(*inputs)
    code = graph_module.code
    program = fx2onnx.dynamo_export(graph_module, *inputs, export_options=make_options(tmp_path))
    assert "Cast" in {node.op_type for node in program.model_proto.graph.node}
    assert graph_module.code == code
    assert_outputs_close(program(*inputs), mixed(*inputs))
