"""FxOnnxInterpreter on tiny FX graphs: one behaviour per opcode, and the types it writes."""

from __future__ import annotations

import math
import operator

import onnx
import onnx_ir as ir
import pytest
import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

import fx2onnx
from conftest import make_options
from diagnostics import DiagnosticContext, DiagnosticOptions
from dispatcher import OnnxFunctionDispatcher, OnnxRegistry
from fx2onnx.translate.fake_metadata import SymbolNamer, onnx_type_of
from fx2onnx.translate.graph_builder import GraphBuilder
from fx2onnx.translate.interpreter import FAILED, FxOnnxInterpreter


@pytest.fixture(scope="module")
def registry() -> OnnxRegistry:
    return OnnxRegistry()


def _interpreter(registry: OnnxRegistry) -> tuple[FxOnnxInterpreter, DiagnosticContext]:
    context = DiagnosticContext("fx2onnx", "test", DiagnosticOptions())
    interpreter = FxOnnxInterpreter(OnnxFunctionDispatcher(registry, context), context, SymbolNamer())
    return interpreter, context


def _with_fake_metadata(graph_module: torch.fx.GraphModule, *args: torch.Tensor) -> torch.fx.GraphModule:
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=True)  # real buffers
    FakeTensorProp(graph_module, mode).propagate(*args)
    return graph_module


def _sym_sizes(x: torch.Tensor):
    rows, cols = x.shape[0], x.shape[1]
    half = math.ceil(rows / 2)  # math.ceil, operator.truediv on SymInts
    flat = x.reshape(rows * cols)  # operator.mul; [SymInt] list -> one int64 tensor
    zeros = x.new_zeros(cols // 2 + half)  # operator.floordiv, operator.add
    top = torch.topk(x, 2).values  # operator.getitem on a multi-output node
    return flat.sum() + zeros.sum(), top


def test_symint_builtins_and_getitem_on_a_symbolic_graph(tmp_path) -> None:
    x = torch.randn(6, 4)
    graph_module = make_fx(_sym_sizes, tracing_mode="symbolic")(x)
    builtins = {n.target for n in graph_module.graph.nodes if n.op == "call_function"}
    assert {math.ceil, operator.mul, operator.floordiv, operator.getitem} <= builtins

    # optimize=False: the nodes the builtins translate to, before the optimizer rewrites them
    program = fx2onnx.dynamo_export(graph_module, x, export_options=make_options(tmp_path, optimize=False))
    proto = program.model_proto
    onnx.checker.check_model(proto, full_check=True)
    assert {"Ceil", "Mul", "TopK", "Concat"} <= {n.op_type for n in proto.graph.node}
    for rows, cols in ((6, 4), (9, 8)):
        sample = torch.randn(rows, cols)
        total, top = program(sample)
        expected_total, expected_top = _sym_sizes(sample)
        torch.testing.assert_close(total, expected_total)
        torch.testing.assert_close(top, expected_top)


def test_every_intermediate_value_is_typed_from_fake_metadata(tmp_path) -> None:
    x = torch.randn(6, 4)
    graph_module = make_fx(_sym_sizes, tracing_mode="symbolic")(x)
    proto = fx2onnx.dynamo_export(graph_module, x, export_options=make_options(tmp_path)).model_proto
    typed = {v.name: v.type.tensor_type for v in proto.graph.value_info}
    outputs = {v.name for v in proto.graph.output}
    for node in proto.graph.node:
        for name in node.output:
            if name in outputs:
                continue
            assert name in typed, f"{node.op_type} output {name!r} has no value_info"
            assert typed[name].elem_type != onnx.TensorProto.UNDEFINED
            assert typed[name].HasField("shape")
    # the reshaped tensor of 6*4 elements is declared with its symbolic size
    flat = next(t for name, t in typed.items() if name.startswith("view"))
    assert [d.dim_param for d in flat.shape.dim] == ["x_1_dim_0*x_1_dim_1"]


def test_call_method_is_a_clear_error_and_translation_goes_on(registry) -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    method = graph.call_method("relu", (x,))
    doubled = graph.call_function(torch.ops.aten.mul.Tensor, (x, x))
    graph.output((method, doubled))
    graph_module = _with_fake_metadata(torch.fx.GraphModule(torch.nn.Module(), graph), torch.randn(2, 3))

    interpreter, context = _interpreter(registry)
    body = interpreter.translate(graph_module, GraphBuilder())

    assert body.env[method] is FAILED and body.failed
    assert isinstance(body.env[doubled], ir.Value)  # the rest was still translated
    (error,) = context.errors()
    assert "call_method" in error.message and "torch.export" in error.message


def test_users_of_a_failed_node_are_skipped_without_more_errors(registry) -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    method = graph.call_method("relu", (x,))
    after = graph.call_function(torch.ops.aten.neg.default, (method,))
    graph.output(after)
    graph_module = _with_fake_metadata(torch.fx.GraphModule(torch.nn.Module(), graph), torch.randn(2, 3))

    interpreter, context = _interpreter(registry)
    body = interpreter.translate(graph_module, GraphBuilder())

    assert body.env[after] is FAILED
    assert len(context.errors()) == 1


def test_get_attr_makes_named_initializers_and_tolerates_graph_modules(registry) -> None:
    root = torch.nn.Module()
    root.register_buffer("scale", torch.full((3,), 2.0))
    root.branch = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())  # a control-flow branch
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    scale = graph.get_attr("scale")
    branch = graph.get_attr("branch")
    out = graph.call_function(torch.ops.aten.mul.Tensor, (x, scale))
    graph.output(out)
    graph_module = _with_fake_metadata(torch.fx.GraphModule(root, graph), torch.randn(2, 3))

    interpreter, context = _interpreter(registry)
    body = interpreter.translate(graph_module, GraphBuilder())

    assert not context.has_errors()
    assert body.env[branch] is graph_module.branch
    initializer = body.builder.graph.initializers["scale"]
    assert initializer.const_value.numpy().tolist() == [2.0, 2.0, 2.0]
    assert body.env[scale] is initializer


def test_call_module_without_a_translator_is_a_clear_error(registry) -> None:
    root = torch.nn.Module()
    root.inner = torch.nn.ReLU()
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    call = graph.call_module("inner", (x,))
    graph.output(call)
    graph_module = _with_fake_metadata(torch.fx.GraphModule(root, graph), torch.randn(2, 3))

    interpreter, context = _interpreter(registry)
    interpreter.translate(graph_module, GraphBuilder())

    (error,) = context.errors()
    assert "Modularize" in error.message


def test_outputs_are_pytree_flattened(registry) -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    neg = graph.call_function(torch.ops.aten.neg.default, (x,))
    graph.output({"a": (x, neg), "b": [neg]})
    graph_module = _with_fake_metadata(torch.fx.GraphModule(torch.nn.Module(), graph), torch.randn(2, 3))

    interpreter, _ = _interpreter(registry)
    outputs = interpreter.translate(graph_module, GraphBuilder()).outputs

    assert [value.name for value in outputs] == [x.name, neg.name, neg.name]
    assert outputs[1] is outputs[2]  # one value, listed twice


@pytest.mark.parametrize(
    ("make", "dtype"),
    [
        (lambda shape_env: shape_env.create_unbacked_symint(), ir.DataType.INT64),
        (lambda shape_env: shape_env.create_unbacked_symfloat(), ir.DataType.DOUBLE),  # a Python float
        (lambda shape_env: shape_env.create_unbacked_symbool(), ir.DataType.BOOL),
    ],
    ids=["SymInt", "SymFloat", "SymBool"],
)
def test_symbolic_scalars_are_0d_tensors(make, dtype) -> None:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    info = onnx_type_of(make(ShapeEnv()), SymbolNamer())
    assert info is not None
    assert (info.dtype, tuple(info.shape), info.is_complex) == (dtype, (), False)


def test_complex_tensor_is_a_real_tensor_with_a_trailing_pair() -> None:
    info = onnx_type_of(torch.zeros(3, 4, dtype=torch.complex64), SymbolNamer())
    assert (info.dtype, tuple(info.shape), info.is_complex) == (ir.DataType.FLOAT, (3, 4, 2), True)


def test_symbolic_dims_get_user_names_and_expressions_of_them() -> None:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    shape_env = ShapeEnv()
    namer = SymbolNamer()
    rows = shape_env.create_unbacked_symint()
    namer.name_symbol(rows, "batch")
    namer.name_symbol(rows, "ignored")  # the first name stays
    assert namer.dim(rows) == "batch"
    assert namer.dim(rows * 2 + 1) == "2*batch+1"
    assert namer.dim(7) == 7


def test_data_dependent_sizes_are_named_after_their_node_and_kept_unique() -> None:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    shape_env = ShapeEnv()
    namer = SymbolNamer()
    first, second, count = (shape_env.create_unbacked_symint() for _ in range(3))
    with torch._subclasses.fake_tensor.FakeTensorMode(shape_env=shape_env):
        result = torch.empty(first, 2)
    namer.name_new_symbols(result, "nonzero")
    namer.name_new_symbols(count, "item")
    namer.name_symbol(second, "nonzero_dim_0")  # taken: gets a suffix
    assert [namer.dim(d) for d in result.shape] == ["nonzero_dim_0", 2]
    assert namer.dim(count) == "item"
    assert namer.dim(second) == "nonzero_dim_0_2"


class NonZero(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        return torch.nonzero(x > 0), x[x > 0.5]


def test_exported_data_dependent_dims_have_readable_names(tmp_path) -> None:
    x = torch.randn(4, 5)
    program = fx2onnx.dynamo_export(NonZero(), x, export_options=make_options(tmp_path, dynamic_shapes=True))
    dims = [[d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in program.model_proto.graph.output]
    assert dims == [["nonzero_dim_0", 2], ["index_dim_0"]]
    for sample in (x, torch.randn(6, 3)):
        indices, selected = program(sample)
        expected_indices, expected_selected = NonZero()(sample)
        torch.testing.assert_close(indices, expected_indices)
        torch.testing.assert_close(selected, expected_selected)
