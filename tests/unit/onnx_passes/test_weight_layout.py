"""Linear weights stored as their MatMul reads them (`onnx_passes/weight_layout.py`)."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from torch import nn

import fx2onnx
from conftest import all_nodes, assert_outputs_close, make_options
from fx2onnx.onnx_passes.weight_layout import (
    LAYOUT_KEY,
    STORED_TRANSPOSED,
    store_weights_transposed,
    store_zero_points_quantized,
)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(8, 8)  # square: a layout mistake keeps the shape
        self.outer = nn.Linear(8, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(torch.relu(self.inner(x)))


class Stack(nn.Module):
    """Two structurally identical blocks (one shared function), nested linears."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = Block(), Block()
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.second(self.first(x)))


class Project(nn.Module):
    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x @ weight.t()


class MixedCallers(nn.Module):
    """One function called with a weight and with a computed matrix: its parameter cannot
    change layout for one caller only."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8))
        self.a, self.b = Project(), Project()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x, self.weight), self.weight * 2)


class TiedReads(nn.Module):
    """A weight read transposed and as it is: stored as the model has it."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t() + x @ self.weight


def _transposes(model: onnx.ModelProto) -> int:
    return sum(node.op_type == "Transpose" for node in all_nodes(model))


def _run_file(path, x: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


@pytest.mark.parametrize("module_functions", [True, False])
def test_linear_weights_are_initializers_matmul_reads(tmp_path, module_functions):
    model, x = Stack().eval(), torch.randn(2, 5, 8)
    program = fx2onnx.dynamo_export(model, x, export_options=make_options(tmp_path, module_functions=module_functions))
    proto = program.model_proto
    assert _transposes(proto) == 0
    weights = {t.name: list(t.dims) for t in proto.graph.initializer}
    assert weights["head.weight"] == [8, 3]  # [in, out]: what MatMul reads
    if not module_functions:
        matmul_weights = [n.input[1] for n in proto.graph.node if n.op_type == "MatMul"]
        assert sorted(matmul_weights) == sorted(n for n in weights if n.endswith("weight"))
    else:
        assert len(proto.functions) >= 2
    assert set(program.model_signature.stored_transposed()) == {n for n in weights if n.endswith("weight")}
    path = tmp_path / "m.onnx"
    program.save(path)
    onnx.checker.check_model(os.fspath(path), full_check=True)
    with torch.no_grad():
        np.testing.assert_allclose(_run_file(path, x), model(x).numpy(), rtol=1e-5, atol=1e-5)


def test_a_function_with_a_computed_caller_keeps_its_transpose(tmp_path):
    model, x = MixedCallers().eval(), torch.randn(3, 8)
    program = fx2onnx.dynamo_export(model, x, export_options=make_options(tmp_path))
    proto = program.model_proto
    assert _transposes(proto) >= 1
    assert [list(t.dims) for t in proto.graph.initializer if t.name == "weight"] == [[8, 8]]
    assert program.model_signature.stored_transposed() == []
    with torch.no_grad():
        assert_outputs_close(program(x), model(x))


def test_a_weight_also_read_untransposed_keeps_its_layout(tmp_path):
    model, x = TiedReads().eval(), torch.randn(3, 8)
    program = fx2onnx.dynamo_export(model, x, export_options=make_options(tmp_path, module_functions=False))
    assert _transposes(program.model_proto) == 1
    with torch.no_grad():
        assert_outputs_close(program(x), model(x))


@pytest.mark.parametrize("fake", [False, True])
def test_weights_given_at_save_are_laid_out_as_stored(tmp_path, fake):
    """A state dict (PyTorch's layout) given at save time is transposed as it is written,
    for a program with weights and for one exported in fake mode."""
    x = torch.randn(2, 5, 8)
    trained = Stack().eval()
    if fake:
        with fx2onnx.enable_fake_mode() as fake_context:
            model = Stack().eval()
            fake_x = fake_context.fake_mode.from_tensor(x)
        options = make_options(tmp_path, fake_context=fake_context)
        program = fx2onnx.dynamo_export(model, fake_x, export_options=options)
    else:
        program = fx2onnx.dynamo_export(Stack().eval(), x, export_options=make_options(tmp_path))
    path = tmp_path / "m.onnx"
    program.save(path, model_state=trained.state_dict(), external_data=True)
    onnx.checker.check_model(os.fspath(path), full_check=True)
    with torch.no_grad():
        np.testing.assert_allclose(_run_file(path, x), trained(x).numpy(), rtol=1e-5, atol=1e-5)


def test_weights_shipped_apart_say_their_layout(tmp_path):
    # 3-D inputs: a linear layer on a matrix is a Gemm that reads the weight as it is (transB)
    program = fx2onnx.dynamo_export(Stack().eval(), torch.randn(2, 4, 8), export_options=make_options(tmp_path))
    path = tmp_path / "graph.onnx"
    program.save(path, include_initializers=False)
    graph = onnx.load(os.fspath(path)).graph
    layouts = {i.name: {p.key: p.value for p in i.metadata_props}.get(LAYOUT_KEY) for i in graph.input}
    assert layouts["head.weight"] == STORED_TRANSPOSED
    assert layouts["head.bias"] is None
    assert [d.dim_value for d in next(i for i in graph.input if i.name == "head.weight").type.tensor_type.shape.dim] == [8, 3]


def _dequantized_linear_model(axis: int) -> ir.Model:
    """``x @ DequantizeLinear(W, scale, zero_point, axis).T``, the zero point an int64
    tensor cast to int8 (as PyTorch keeps per-channel zero points)."""
    rng = np.random.default_rng(0)
    weight = ir.Value(name="W", type=ir.TensorType(ir.DataType.INT8), shape=ir.Shape([4, 3]),
                      const_value=ir.tensor(rng.integers(-100, 100, (4, 3)).astype(np.int8), name="W"))
    channels = 4 if axis == 0 else 3
    scale = ir.Value(name="scale", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([channels]),
                     const_value=ir.tensor(rng.uniform(0.01, 0.1, channels).astype(np.float32), name="scale"))
    zero64 = ir.Value(name="zero64", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([channels]),
                      const_value=ir.tensor(rng.integers(-3, 3, channels).astype(np.int64), name="zero64"))
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, 3]))
    cast = ir.node("Cast", [zero64], attributes={"to": ir.DataType.INT8})
    cast.outputs[0].name, cast.outputs[0].dtype, cast.outputs[0].shape = "zero8", ir.DataType.INT8, ir.Shape([channels])
    dequantize = ir.node("DequantizeLinear", [weight, scale, cast.outputs[0]], attributes={"axis": axis})
    dequantize.outputs[0].dtype, dequantize.outputs[0].shape = ir.DataType.FLOAT, ir.Shape([4, 3])
    transpose = ir.node("Transpose", [dequantize.outputs[0]], attributes={"perm": [1, 0]})
    transpose.outputs[0].dtype, transpose.outputs[0].shape = ir.DataType.FLOAT, ir.Shape([3, 4])
    matmul = ir.node("MatMul", [x, transpose.outputs[0]])
    matmul.outputs[0].name, matmul.outputs[0].dtype, matmul.outputs[0].shape = "y", ir.DataType.FLOAT, ir.Shape([2, 4])
    graph = ir.Graph([x], [matmul.outputs[0]], nodes=[cast, dequantize, transpose, matmul],
                     initializers=[weight, scale, zero64], opset_imports={"": 21}, name="dequantized_linear")
    return ir.Model(graph, ir_version=10)


def _run_model(model: ir.Model, x: np.ndarray) -> np.ndarray:
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto, full_check=True)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("axis", [0, 1])
def test_a_dequantized_weight_is_stored_transposed_along_the_other_axis(axis):
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    model = _dequantized_linear_model(axis)
    expected = _run_model(model, x)
    assert store_weights_transposed(model) == ["W"]
    assert store_zero_points_quantized(model) == ["zero8"]
    kinds = [node.op_type for node in model.graph]
    assert kinds == ["DequantizeLinear", "MatMul"]
    dequantize = next(iter(model.graph))
    assert dequantize.attributes["axis"].as_int() == 1 - axis
    assert model.graph.initializers["W"].shape == ir.Shape([3, 4])
    assert model.graph.initializers["zero8"].dtype == ir.DataType.INT8 and "zero64" not in model.graph.initializers
    np.testing.assert_allclose(_run_model(model, x), expected, rtol=1e-6, atol=1e-6)
