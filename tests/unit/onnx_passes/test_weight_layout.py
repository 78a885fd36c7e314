"""Linear weights stored as their MatMul reads them (`onnx_passes/weight_layout.py`)."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import fx2onnx
from conftest import all_nodes, assert_outputs_close, make_options
from fx2onnx.onnx_passes.weight_layout import LAYOUT_KEY, STORED_TRANSPOSED


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
