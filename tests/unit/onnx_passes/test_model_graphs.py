"""One traversal for every ONNX pass: `model_graphs` visits the main graph, every
function body and the sub-graphs inside either; `FunctionCalls` sees through calls. No
pass walks the graphs its own way (where a new pass would forget the functions)."""

from __future__ import annotations

import re
from pathlib import Path

import onnx_ir as ir

from fx2onnx.onnx_passes.function_calls import FunctionCalls
from fx2onnx.onnx_passes.model_graphs import model_graphs, model_nodes

PASSES = Path(__file__).resolve().parents[3] / "fx2onnx" / "onnx_passes"
TRAVERSAL = {"model_graphs.py"}
# walking the graphs by hand: onnx_ir's iterator, or the main graph and the bodies listed
OWN_WALKS = re.compile(r"RecursiveGraphIterator|\[model\.graph, \*model\.functions\.values\(\)\]")


def test_no_pass_walks_the_graphs_its_own_way():
    walking = [path.name for path in sorted(PASSES.glob("*.py")) if path.name not in TRAVERSAL and OWN_WALKS.search(path.read_text())]
    assert not walking, f"use model_graphs/model_nodes (fx2onnx/onnx_passes/model_graphs.py) in {walking}"


def _model_with_a_function_calling_an_if() -> tuple[ir.Model, ir.Function]:
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    condition = ir.Value(name="condition", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    branch = ir.Graph([], [], nodes=[ir.node("Constant", [], {"value": ir.tensor([1.0, 2.0])}, name="in_branch")], name="b")
    branch.outputs.append(branch[0].outputs[0])
    other = ir.Graph([], [], nodes=[ir.node("Constant", [], {"value": ir.tensor([3.0, 4.0])}, name="in_else")], name="e")
    other.outputs.append(other[0].outputs[0])
    parameter = ir.Value(name="p", type=x.type, shape=x.shape)
    flag = ir.Value(name="flag", type=condition.type, shape=condition.shape)
    chosen = ir.node("If", [flag], {"then_branch": branch, "else_branch": other}, name="choose")
    added = ir.node("Add", [parameter, chosen.outputs[0]], name="add")
    body = ir.Graph([parameter, flag], [added.outputs[0]], nodes=[chosen, added], name="F", opset_imports={"": 18})
    function = ir.Function("local", "F", "", graph=body, attributes={})
    call = ir.node("F", [x, condition], domain="local", name="call")
    graph = ir.Graph([x, condition], [call.outputs[0]], nodes=[call], name="main", opset_imports={"": 18, "local": 1})
    weight = ir.Value(name="w", type=x.type, shape=x.shape, const_value=ir.tensor([0.5, 0.5], name="w"))
    graph.register_initializer(weight)
    call.replace_input_with(0, weight)
    return ir.Model(graph, ir_version=10, functions=[function]), function


def test_model_graphs_reach_the_sub_graphs_inside_function_bodies():
    model, function = _model_with_a_function_calling_an_if()
    names = {node.name for node in model_nodes(model)}
    assert {"call", "choose", "add", "in_branch", "in_else"} <= names
    assert len(list(model_graphs(model))) == 4  # main, F, then, else


def test_function_calls_find_the_stored_value_behind_a_parameter():
    model, function = _model_with_a_function_calling_an_if()
    calls = FunctionCalls(model)
    weight, flag = function.inputs
    assert calls.is_stored(weight) and calls.is_initializer_behind(weight)
    assert not calls.is_stored(flag)  # a graph input: known only at run time
    assert [node.name for node, _ in calls.final_uses(model.graph.initializers["w"])] == ["add"]
