"""`FxOnnxInterpreter.translate`, the one entry point that turns a GraphModule into a
graph body, and `GraphBuilder.set_outputs`, the one place outputs are copied."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import onnxruntime
import pytest
import torch
import torch.fx

from diagnostics import DiagnosticContext, DiagnosticOptions, Level, rules
from dispatcher import NodeRoute, OnnxFunctionDispatcher, OnnxRegistry, node_route
from fx2onnx.translate.fake_metadata import OnnxTypeInfo, SymbolNamer
from fx2onnx.translate.graph_builder import GraphBuilder, inference_note
from fx2onnx.translate.interpreter import FAILED, BodyInitializer, BodyInput, FxOnnxInterpreter


@pytest.fixture(scope="module")
def registry() -> OnnxRegistry:
    return OnnxRegistry()


def _interpreter(registry: OnnxRegistry) -> tuple[FxOnnxInterpreter, DiagnosticContext]:
    context = DiagnosticContext("fx2onnx", "test", DiagnosticOptions())
    return FxOnnxInterpreter(OnnxFunctionDispatcher(registry, context), context, SymbolNamer()), context


def _graph_module(build, *examples: torch.Tensor) -> torch.fx.GraphModule:
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    graph = torch.fx.Graph()
    build(graph)
    graph_module = torch.fx.GraphModule(torch.nn.Module(), graph)
    mode = torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(graph_module, mode).propagate(*examples)
    return graph_module


def _run(builder: GraphBuilder, feeds: dict[str, torch.Tensor]) -> list:
    model = builder.build_model("test")
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto, full_check=True)
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {name: value.numpy() for name, value in feeds.items()})


def _add_mul(graph: torch.fx.Graph) -> None:
    x = graph.placeholder("x")
    w = graph.placeholder("w")
    total = graph.call_function(torch.ops.aten.add.Tensor, (x, w))
    graph.output((graph.call_function(torch.ops.aten.mul.Tensor, (total, x)), x, total, total))


def test_default_bindings_make_graph_inputs_and_outputs_are_returned_not_registered(registry) -> None:
    x, w = torch.randn(2, 3), torch.randn(2, 3)
    graph_module = _graph_module(_add_mul, x, w)
    interpreter, context = _interpreter(registry)
    builder = GraphBuilder()

    body = interpreter.translate(graph_module, builder)

    assert not context.has_errors() and not body.failed
    assert [v.name for v in builder.graph.inputs] == ["x", "w"]
    assert builder.graph.outputs == []  # the caller decides which values leave the graph
    assert len(body.outputs) == 4 and body.outputs[1] is builder.graph.inputs[0]
    assert [tuple(m.shape) for m in body.output_metas] == [(2, 3)] * 4

    outputs = builder.set_outputs(body.outputs)
    # an input and a value listed twice leave through Identity copies
    assert [v.producer().op_type for v in outputs[1:]] == ["Identity", "Add", "Identity"]
    assert len({id(v) for v in outputs}) == 4
    results = _run(builder, {"x": x, "w": w})
    for got, expected in zip(results, [(x + w) * x, x, x + w, x + w]):
        torch.testing.assert_close(torch.from_numpy(got), expected)


def test_bindings_to_initializers_outer_values_constants_and_named_inputs(registry) -> None:
    def build(graph: torch.fx.Graph) -> None:
        x = graph.placeholder("x")
        w = graph.placeholder("w")
        s = graph.placeholder("s")
        graph.output(graph.call_function(torch.ops.aten.add.Tensor, (graph.call_function(torch.ops.aten.mul.Tensor, (x, w)), s)))

    weight = torch.full((3,), 2.0)
    graph_module = _graph_module(build, torch.randn(2, 3), weight, torch.randn(2, 3))
    interpreter, context = _interpreter(registry)
    builder = GraphBuilder()
    outer = builder.add_input("outer", ir.DataType.FLOAT, ir.Shape([2, 3]))

    body = interpreter.translate(
        graph_module,
        builder,
        inputs={
            "x": BodyInput("renamed", OnnxTypeInfo(ir.DataType.FLOAT, ir.Shape(["n", 3]))),
            "w": BodyInitializer("weight", weight),
            "s": outer,
        },
    )

    assert not context.has_errors()
    assert [v.name for v in builder.graph.inputs] == ["outer", "renamed"]
    assert builder.graph.inputs[1].shape == ir.Shape(["n", 3])
    assert list(builder.graph.initializers) == ["weight"]
    assert body.env[graph_module.graph.find_nodes(op="placeholder")[2]] is outer
    builder.set_outputs(body.outputs)
    x, s = torch.randn(2, 3), torch.randn(2, 3)
    (result,) = _run(builder, {"renamed": x, "outer": s})
    torch.testing.assert_close(torch.from_numpy(result), x * weight + s)


def test_skipped_nodes_and_their_users_are_not_translated_nor_reported(registry) -> None:
    def build(graph: torch.fx.Graph) -> None:
        x = graph.placeholder("x")
        neg = graph.call_function(torch.ops.aten.neg.default, (x,))
        graph.output((graph.call_function(torch.ops.aten.relu.default, (neg,)), graph.call_function(torch.ops.aten.abs.default, (x,))))

    graph_module = _graph_module(build, torch.randn(2))
    neg, relu, abs_ = [n for n in graph_module.graph.nodes if n.op == "call_function"]
    interpreter, context = _interpreter(registry)

    body = interpreter.translate(graph_module, GraphBuilder(), skip=[neg])

    assert body.failed and body.env[neg] is FAILED and body.env[relu] is FAILED
    assert isinstance(body.env[abs_], ir.Value)
    assert not context.has_errors()  # skipped nodes were reported by whoever skipped them
    assert body.outputs == []  # the output node uses a failed node: nothing is returned


def test_translations_nest_without_sharing_state(registry) -> None:
    """A body translated while another is (a module function, an If branch) has its own
    environment and builder; the outer translation goes on unaffected."""
    inner_module = _graph_module(lambda g: g.output(g.call_function(torch.ops.aten.neg.default, (g.placeholder("y"),))), torch.randn(2))
    inner_results = []

    def handler(interpreter: FxOnnxInterpreter, node: torch.fx.Node, args: list) -> ir.Value:
        sub = interpreter.builder.subgraph("inner")
        inner = interpreter.translate(inner_module, sub, inputs={"y": args[0]})
        inner_results.append(inner)
        (out,) = sub.set_outputs(inner.outputs)
        return args[0]

    root = torch.nn.Module()
    root.block = torch.nn.Identity()
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    call = graph.call_module("block", (x,))
    graph.output(graph.call_function(torch.ops.aten.abs.default, (call,)))
    graph_module = torch.fx.GraphModule(root, graph)
    x.meta["val"] = torch.empty(2)
    call.meta["val"] = torch.empty(2)
    list(graph.nodes)[2].meta["val"] = torch.empty(2)
    context = DiagnosticContext("fx2onnx", "test", DiagnosticOptions())
    interpreter = FxOnnxInterpreter(OnnxFunctionDispatcher(registry, context), context, SymbolNamer(), call_module_handler=handler)
    builder = GraphBuilder()

    body = interpreter.translate(graph_module, builder)

    assert not context.has_errors(), context.summary_text()
    (inner,) = inner_results
    assert inner.builder is not builder and set(inner.env).isdisjoint(body.env)
    # the subgraph read the outer value by name and drew its names from the outer pool
    (neg_node,) = list(inner.builder.graph)
    assert neg_node.inputs[0] is builder.graph.inputs[0]
    outer_names = {v.name for n in builder.graph for v in n.outputs}
    assert outer_names.isdisjoint(v.name for n in inner.builder.graph for v in n.outputs)
    assert [n.op_type for n in builder.graph] == ["Abs"]


def test_set_outputs_copies_values_of_an_enclosing_graph() -> None:
    builder = GraphBuilder()
    x = builder.add_input("x", ir.DataType.FLOAT, ir.Shape([2]))
    (outer,) = builder.add_node("", "Neg", [x])
    sub = builder.subgraph("branch")
    (copy,) = sub.set_outputs([outer])
    assert copy.producer().op_type == "Identity" and copy.producer().graph is sub.graph
    assert copy.dtype == ir.DataType.FLOAT and copy.shape == ir.Shape([2])


def test_inference_failures_give_one_note_per_op_type() -> None:
    context = DiagnosticContext("fx2onnx", "test", DiagnosticOptions())
    builder = GraphBuilder(on_inference_failure=inference_note(context))
    x = builder.add_input("x", ir.DataType.FLOAT, ir.Shape([2, 3]))
    y = builder.add_input("y", ir.DataType.FLOAT, ir.Shape([4, 5]))
    for _ in range(3):
        (out,) = builder.add_node("", "Add", [x, y])  # shapes that do not broadcast
        assert out.shape is None  # left untyped, never a failure
    notes = [d for d in context.diagnostics if d.rule is rules.GRAPH_BUILDING and d.level is Level.NOTE]
    assert len(notes) == 1 and "Add" in notes[0].message and "Incompatible dimensions" in notes[0].message


def test_one_routing_decision_for_analysis_and_translation() -> None:
    import operator

    assert node_route(operator.getitem) is NodeRoute.GETITEM
    assert node_route(torch.return_types.topk) is NodeRoute.TUPLE
    assert node_route(torch.ops.higher_order.cond) is NodeRoute.HIGHER_ORDER
    assert node_route(torch.ops.aten.add.Tensor) is NodeRoute.ONNX_FUNCTION


def test_analysis_names_higher_order_operators_without_a_translation(registry) -> None:
    from fx2onnx.translate.analysis import find_unsupported_nodes

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    hop = torch.ops.higher_order.associative_scan
    call = graph.call_function(hop, (None, [x], 0))
    graph.output(call)
    graph_module = torch.fx.GraphModule(torch.nn.Module(), graph)
    context = DiagnosticContext("fx2onnx", "test", DiagnosticOptions())

    [(node, reason)] = find_unsupported_nodes(graph_module, OnnxFunctionDispatcher(registry, context))
    assert node is call and "associative_scan" in reason and "cond" in reason


def _cond_graph(predicate) -> torch.fx.GraphModule:
    import operator

    def branch(op) -> torch.fx.GraphModule:
        graph = torch.fx.Graph()
        x = graph.placeholder("x")
        graph.output((graph.call_function(op, (x,)),))
        return torch.fx.GraphModule(torch.nn.Module(), graph)

    root = torch.nn.Module()
    root.true_graph, root.false_graph = branch(torch.ops.aten.sin.default), branch(torch.ops.aten.cos.default)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    pred = graph.placeholder("pred") if predicate is None else predicate
    cond = graph.call_function(
        torch.ops.higher_order.cond, (pred, graph.get_attr("true_graph"), graph.get_attr("false_graph"), (x,))
    )
    graph.output(graph.call_function(operator.getitem, (cond, 0)))
    graph_module = torch.fx.GraphModule(root, graph)
    examples = (torch.randn(3),) if predicate is not None else (torch.randn(3), torch.tensor(True))
    return _graph_module_with_meta(graph_module, *examples)


def _graph_module_with_meta(graph_module: torch.fx.GraphModule, *examples) -> torch.fx.GraphModule:
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(graph_module, mode).propagate(*examples)
    for sub in (graph_module.true_graph, graph_module.false_graph):
        FakeTensorProp(sub, mode).propagate(examples[0])
    return graph_module


@pytest.mark.parametrize("predicate", [True, False])
def test_a_cond_with_a_known_predicate_translates_the_taken_branch_in_place(registry, predicate) -> None:
    interpreter, context = _interpreter(registry)
    builder = GraphBuilder()
    body = interpreter.translate(_cond_graph(predicate), builder)
    assert not context.has_errors(), context.summary_text()
    assert [n.op_type for n in builder.graph] == ["Sin" if predicate else "Cos"]  # no If
    builder.set_outputs(body.outputs)
    x = torch.randn(3)
    (result,) = _run(builder, {"x": x})
    torch.testing.assert_close(torch.from_numpy(result), x.sin() if predicate else x.cos())


def test_a_cond_on_a_graph_input_becomes_an_if_with_both_branches(registry) -> None:
    interpreter, context = _interpreter(registry)
    builder = GraphBuilder()
    body = interpreter.translate(_cond_graph(None), builder)
    assert not context.has_errors(), context.summary_text()
    (if_node,) = list(builder.graph)
    branches = {name: [n.op_type for n in attr.value] for name, attr in if_node.attributes.items()}
    assert branches == {"then_branch": ["Sin"], "else_branch": ["Cos"]}
    builder.set_outputs(body.outputs)
    x = torch.randn(3)
    for flag in (True, False):
        (result,) = _run(builder, {"x": x, "pred": torch.tensor(flag)})
        torch.testing.assert_close(torch.from_numpy(result), x.sin() if flag else x.cos())
