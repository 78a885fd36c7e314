"""Nodes of constants alone that onnxscript's folder leaves (ONNX's reference evaluator
fails on them) are computed by onnxruntime: in a graph, in chains, within the limits;
nodes of inputs, random nodes and nodes onnxruntime refuses stay."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch

import fx2onnx
from conftest import all_nodes, assert_outputs_close, make_options
from fx2onnx.onnx_passes.runtime_folding import fold_with_onnxruntime

OPSET = 20


def _model() -> tuple[ir.Model, dict[str, ir.Node]]:
    """GatherElements of a (1, 64) table by (1, 8) indices, which ONNX's reference evaluator
    cannot compute, expanded, added to the input; a random node; a Gather whose constant
    index is out of range (onnxruntime refuses it)."""
    x = ir.val("x", ir.DataType.INT64, ir.Shape([2, 8]))
    table = ir.Value(name="table", const_value=ir.tensor(np.arange(64, dtype=np.int64).reshape(1, 64) * 3))
    index = ir.Value(name="index", const_value=ir.tensor(np.arange(8, dtype=np.int64).reshape(1, 8) + 5))
    shape = ir.Value(name="shape", const_value=ir.tensor(np.array([2, 8], dtype=np.int64)))
    wrong = ir.Value(name="wrong", const_value=ir.tensor(np.array([99], dtype=np.int64)))
    nodes = {
        "gather": ir.node("GatherElements", [table, index], attributes={"axis": 1}, name="gather"),
    }
    nodes["expand"] = ir.node("Expand", [nodes["gather"].outputs[0], shape], name="expand")
    nodes["add"] = ir.node("Add", [x, nodes["expand"].outputs[0]], name="add")
    nodes["random"] = ir.node("RandomNormalLike", [nodes["expand"].outputs[0]], attributes={"dtype": 1}, name="random")
    nodes["refused"] = ir.node("Gather", [table, wrong], attributes={"axis": 1}, name="refused")
    for node in nodes.values():
        node.outputs[0].name = node.name
        node.outputs[0].type = ir.TensorType(ir.DataType.FLOAT if node.name == "random" else ir.DataType.INT64)
        node.outputs[0].shape = ir.Shape({"gather": [1, 8], "refused": [1, 1]}.get(node.name, [2, 8]))
    graph = ir.Graph([x], [nodes["add"].outputs[0], nodes["random"].outputs[0], nodes["refused"].outputs[0]],
                     nodes=list(nodes.values()), initializers=[table, index, shape, wrong], opset_imports={"": OPSET},
                     name="folding")
    return ir.Model(graph, ir_version=10), nodes


def test_reference_evaluator_fails_where_onnxruntime_folds():
    # why the fallback exists: onnxscript's folder leaves this node
    from onnxscript.optimizer import fold_constants_ir

    model, _ = _model()
    fold_constants_ir(model, onnx_shape_inference=False)
    assert "GatherElements" in [node.op_type for node in model.graph]


@pytest.mark.parametrize("as_initializers", [False, True])
def test_constant_chains_fold_and_the_rest_stays(as_initializers):
    model, _ = _model()
    made = fold_with_onnxruntime(model.graph, OPSET, as_initializers=as_initializers)
    assert [value.name for value in made] == ["gather", "expand"]  # the chain folds through
    assert [node.op_type for node in model.graph if node.op_type != "Constant"] == ["Add", "RandomNormalLike", "Gather"]
    assert ("expand" in model.graph.initializers) == as_initializers
    np.testing.assert_array_equal(made[1].const_value.numpy(), np.broadcast_to((np.arange(8) + 5) * 3, (2, 8)))
    onnx.checker.check_model(ir.serde.serialize_model(model), full_check=True)


def test_may_fold_is_asked():
    model, _ = _model()
    made = fold_with_onnxruntime(model.graph, OPSET, lambda node: node.op_type != "GatherElements")
    assert made == [] and "GatherElements" in [node.op_type for node in model.graph]


class GatheredBuffer(torch.nn.Module):
    """BERT's token types: a buffer gathered by a buffer of positions, then embedded."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("types", torch.zeros(1, 64, dtype=torch.long))
        self.register_buffer("positions", torch.arange(64).unsqueeze(0))
        self.embedding = torch.nn.Embedding(2, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = self.positions[:, : x.shape[1]]
        types = torch.gather(self.types.expand(positions.shape[0], -1), 1, positions)
        return x + self.embedding(types.expand(x.shape[0], -1))


def test_portable_export_keeps_no_node_of_constants_alone(tmp_path):
    model, x = GatheredBuffer().eval(), torch.randn(3, 8, 4)
    program = fx2onnx.dynamo_export(model, x, export_options=make_options(tmp_path, target="portable"))
    proto = program.model_proto
    onnx.checker.check_model(proto, full_check=True)
    constants = {t.name for t in proto.graph.initializer}
    left = [n.op_type for n in all_nodes(proto) if n.input and all(i in constants for i in n.input)]
    assert left == [] and [n.op_type for n in all_nodes(proto)] == ["Add"]
    assert_outputs_close(program(x), model(x))


def test_what_the_folder_keeps_on_purpose_stays():
    # a filled tensor is smaller as its shape: ConstantOfShape of a constant shape stays
    shape = ir.Value(name="shape", const_value=ir.tensor(np.array([64, 64], dtype=np.int64)))
    node = ir.node("ConstantOfShape", [shape], name="filled")
    graph = ir.Graph([], [node.outputs[0]], nodes=[node], initializers=[shape], opset_imports={"": OPSET}, name="kept")
    assert fold_with_onnxruntime(graph, OPSET) == [] and [n.op_type for n in graph] == ["ConstantOfShape"]
