"""Unit tests of the FX passes on small graphs, one pass at a time, and of the private
torch operators they name."""

from __future__ import annotations

import torch
import torch.fx

from dispatcher import OnnxRegistry
from fx2onnx.private_ops import assertion_ops, missing_private_ops, torch_op, training_batch_norm_ops, with_effects_op


def test_every_private_torch_operator_still_resolves() -> None:
    # A failure here means PyTorch renamed or removed an operator fx2onnx names:
    # update fx2onnx/private_ops.py.
    assert missing_private_ops() == []
    assert torch.ops.aten._assert_scalar.default in assertion_ops()
    assert training_batch_norm_ops()[torch.ops.aten._native_batch_norm_legit_functional.default] == 5
    assert with_effects_op() is torch.ops.higher_order.with_effects


def test_a_missing_operator_is_none_not_an_error() -> None:
    assert torch_op("aten.no_such_operator.default") is None
    assert torch_op("no_such_namespace.op.default") is None


# -- helpers --------------------------------------------------------------------------------------
def _symbolic(fn, *args) -> torch.fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*args)


def _targets(graph_module: torch.fx.GraphModule) -> list:
    return [n.target for n in graph_module.graph.nodes if n.op == "call_function"]


def _run_fx(graph_module: torch.fx.GraphModule, *args):
    return torch.fx.Interpreter(graph_module).run(*args)


# -- functionalize --------------------------------------------------------------------------------
def test_functionalize_lifts_input_mutations_to_leading_outputs() -> None:
    from fx2onnx.fx_passes.functionalize import INPUT_MUTATIONS, functionalize_graph_module, has_in_place_ops

    def fn(x, y):
        x.add_(1)
        view = y[:, 0]
        view.mul_(2)
        return x + y

    graph_module = _symbolic(fn, torch.randn(2, 3), torch.randn(2, 3))
    assert has_in_place_ops(graph_module)
    functional = functionalize_graph_module(graph_module)
    assert not has_in_place_ops(functional)
    assert functional.meta[INPUT_MUTATIONS] == ["x_1", "y_1"]  # make_fx's placeholder names
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    (new_x, new_y), result = _run_fx(functional, x.clone(), y.clone())
    ex, ey = x.clone(), y.clone()
    expected = fn(ex, ey)
    torch.testing.assert_close(result, expected)
    torch.testing.assert_close(new_x, ex)
    torch.testing.assert_close(new_y, ey)


def test_functionalize_returns_a_functional_graph_as_it_is() -> None:
    from fx2onnx.fx_passes.functionalize import functionalize_graph_module

    graph_module = _symbolic(lambda x: x * 2, torch.randn(3))
    assert functionalize_graph_module(graph_module) is graph_module


# -- remove_assertions ----------------------------------------------------------------------------
def test_remove_assertions_erases_unused_runtime_checks_only() -> None:
    from fx2onnx.fx_passes.remove_assertions import remove_assertions

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    flag = graph.call_function(torch.ops.aten.gt.Scalar, (x, 0))
    graph.call_function(torch.ops.aten._assert_async.msg, (flag, "positive"))
    graph.call_function(torch.ops.aten._assert_tensor_metadata.default, (x,))
    # a condition the output reads too: kept; one computed for its assertion alone: removed with it
    kept = graph.call_function(torch.ops.aten.lt.Scalar, (x, 9))
    graph.call_function(torch.ops.aten._assert_async.msg, (kept, "small"))
    graph.output((graph.call_function(torch.ops.aten.relu.default, (x,)), kept))
    graph_module = torch.fx.GraphModule(torch.nn.Module(), graph)

    assert remove_assertions(graph_module) == 3
    assert _targets(graph_module) == [torch.ops.aten.lt.Scalar, torch.ops.aten.relu.default]
    assert remove_assertions(graph_module) == 0


def test_remove_assertions_takes_the_condition_transformers_checks_with() -> None:
    """transformers' `torch_compilable_check` while exporting: `_is_all_true`, `item` and a
    comparison feed only `_assert_scalar`; none is left to translate (`_is_all_true` has no ONNX function)."""
    from fx2onnx.fx_passes.remove_assertions import remove_assertions

    class Checked(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            torch._check_tensor_all(x > 0)
            return x.relu()

    graph_module = torch.export.export(Checked(), (torch.ones(3),)).graph_module
    assert torch.ops.aten._is_all_true.default in _targets(graph_module)
    assert remove_assertions(graph_module) >= 1
    assert _targets(graph_module) == [torch.ops.aten.relu.default]


# -- decompose_nodes ------------------------------------------------------------------------------
def test_decompose_nodes_replaces_diagonal_scatter_by_index_put_in_place() -> None:
    from fx2onnx.fx_passes.node_decompositions import decompose_nodes

    graph_module = _symbolic(lambda x, d: torch.diagonal_scatter(x, d, 1), torch.randn(4, 5), torch.randn(4))
    scatter = next(n for n in graph_module.graph.nodes if n.target == torch.ops.aten.diagonal_scatter.default)
    scatter.meta["stack_trace"] = 'File "model.py", line 7, in forward'

    assert decompose_nodes(graph_module, OnnxRegistry()) == 1
    targets = _targets(graph_module)
    assert torch.ops.aten.diagonal_scatter.default not in targets
    assert torch.ops.aten.index_put.default in targets
    # the replacement nodes keep the user's line
    assert all(n.meta.get("stack_trace") == scatter.meta["stack_trace"] for n in graph_module.graph.nodes if n.op == "call_function")
    x, d = torch.randn(4, 5), torch.randn(4)
    torch.testing.assert_close(_run_fx(graph_module, x, d), torch.diagonal_scatter(x, d, 1))


def test_decompose_nodes_notes_a_node_it_keeps_whole() -> None:
    from diagnostics import DiagnosticContext, DiagnosticOptions, Level
    from fx2onnx.fx_passes import node_decompositions as module

    graph_module = _symbolic(lambda x, d: torch.diagonal_scatter(x, d), torch.randn(3, 3), torch.randn(3))
    context = DiagnosticContext("fx2onnx", "test", DiagnosticOptions())

    def refuse(*args, **kwargs):
        raise NotImplementedError("decompositions that create constants are not inlined")

    original = module._inline
    module._inline = refuse
    try:
        assert module.decompose_nodes(graph_module, OnnxRegistry(), context) == 0
    finally:
        module._inline = original
    (note,) = [d for d in context.diagnostics if d.level is Level.NOTE]
    assert "diagonal_scatter" in note.message and "keeps" in note.message


# -- type promotion -------------------------------------------------------------------------------
def test_type_promotion_casts_the_narrower_input_before_the_node() -> None:
    from fx2onnx.fx_passes.type_promotion import insert_type_promotion

    graph_module = _symbolic(lambda a, b: a + b, torch.ones(3, dtype=torch.int32), torch.ones(3))
    add = next(n for n in graph_module.graph.nodes if n.target == torch.ops.aten.add.Tensor)

    assert insert_type_promotion(graph_module) == 1
    cast = add.args[0]
    assert cast.target == torch.ops.aten._to_copy.default and cast.kwargs["dtype"] == torch.float32
    assert cast.meta["val"].dtype == torch.float32
    assert add.args[1].op == "placeholder"  # the float input is left as it is
    assert insert_type_promotion(graph_module) == 0  # nothing left to promote


def test_type_promotion_widens_reductions_like_pytorch() -> None:
    from fx2onnx.fx_passes.type_promotion import insert_type_promotion

    graph_module = _symbolic(lambda a: a.sum(), torch.ones(3, dtype=torch.int32))
    assert insert_type_promotion(graph_module) == 1
    total = next(n for n in graph_module.graph.nodes if n.target == torch.ops.aten.sum.default)
    assert total.args[0].meta["val"].dtype == torch.int64


# -- effect tokens --------------------------------------------------------------------------------
def test_remove_effect_tokens_unwraps_and_drops_token_placeholders() -> None:
    from fx2onnx.fx_passes.effect_tokens import remove_effect_tokens
    import operator

    graph = torch.fx.Graph()
    token = graph.placeholder("token")
    x = graph.placeholder("x")
    wrapped = graph.call_function(torch.ops.higher_order.with_effects, (token, torch.ops.aten.relu.default, x))
    wrapped.meta["val"] = (torch.empty(0), torch.empty(3))
    new_token = graph.call_function(operator.getitem, (wrapped, 0))
    result = graph.call_function(operator.getitem, (wrapped, 1))
    graph.output((new_token, result))
    graph_module = torch.fx.GraphModule(torch.nn.Module(), graph)

    assert remove_effect_tokens(graph_module, {"token"}) == 1
    assert [n.name for n in graph_module.graph.nodes if n.op == "placeholder"] == ["x"]
    assert _targets(graph_module) == [torch.ops.aten.relu.default]
    output = next(n for n in graph_module.graph.nodes if n.op == "output")
    assert output.args[0][0] is None
    x_value = torch.randn(3)
    torch.testing.assert_close(_run_fx(graph_module, x_value)[1], x_value.relu())


# -- modularize -----------------------------------------------------------------------------------
class _Inner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.linear(x).relu()


class _Outer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = _Inner(), _Inner()

    def forward(self, x):
        return self.b(self.a(x)) * 2


def test_modularize_groups_module_calls_into_called_graph_modules() -> None:
    from fx2onnx.options import ModuleFunctionOptions
    from fx2onnx.fx_passes.modularize import module_calls, modularize

    model = _Outer().eval()
    program = torch.export.export(model, (torch.randn(2, 3),))
    graph_module = program.graph_module
    names = {spec.arg.name: spec.target for spec in program.graph_signature.input_specs if spec.target}
    modular = modularize(graph_module, ModuleFunctionOptions(), names)

    calls = module_calls(modular)
    assert [call.path for _, call in calls] == ["a", "b"]
    assert all(call.class_name.endswith("_Inner") for _, call in calls)
    # the grouped graph computes what the flat one does
    inputs = [program.state_dict[names[p.name]] if p.name in names else None
              for p in graph_module.graph.nodes if p.op == "placeholder"]
    x = torch.randn(2, 3)
    inputs[-1] = x
    torch.testing.assert_close(_run_fx(modular, *inputs)[0], model(x))
    assert modularize(graph_module, ModuleFunctionOptions(include=("NoSuchClass",)), names) is graph_module


# -- remove_identity_views ------------------------------------------------------------------------
def _make_fx_symbolic(fn, *args) -> torch.fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="symbolic")(*args)


def test_identity_views_are_removed_and_real_reshapes_kept() -> None:
    from fx2onnx.fx_passes.remove_identity_views import remove_identity_views

    def fn(x):
        flat = x.reshape(-1) * 2  # a real reshape
        same = x.view(x.shape).clone().expand(x.shape)  # three identities
        return same + flat.view(x.shape[0], x.shape[1]).expand(3, *x.shape)  # a real view and expand

    aten = torch.ops.aten
    graph_module = _symbolic(fn, torch.randn(4, 6))
    before = _targets(graph_module)
    assert remove_identity_views(graph_module) == 3
    after = _targets(graph_module)
    assert aten.clone.default in before and aten.clone.default not in after
    assert after.count(aten.expand.default) == 1 and len(after) == len(before) - 3
    x = torch.randn(4, 6)
    torch.testing.assert_close(_run_fx(graph_module, x), fn(x))


def test_identity_views_with_symbolic_sizes() -> None:
    from fx2onnx.fx_passes.remove_identity_views import remove_identity_views

    def fn(x):
        return x.view(x.shape[0], x.shape[1]) * 2, x.view(x.shape[1], x.shape[0])

    graph_module = _make_fx_symbolic(fn, torch.randn(4, 6))
    views = _targets(graph_module).count(torch.ops.aten.view.default)
    assert remove_identity_views(graph_module) == 1  # the view swapping the sizes is kept
    assert _targets(graph_module).count(torch.ops.aten.view.default) == views - 1
    x = torch.randn(5, 3)
    for actual, expected in zip(_run_fx(graph_module, x), fn(x)):
        torch.testing.assert_close(actual, expected)


def test_reshape_chains_collapse_into_one() -> None:
    from fx2onnx.fx_passes.remove_identity_views import remove_identity_views

    def fn(x):
        shared = x.reshape(6, 4)
        chain = shared.view(3, 8).reshape(-1)  # two reshapes of reshapes
        return chain, shared * 2  # `shared` has another user: it stays

    graph_module = _symbolic(fn, torch.randn(4, 6))
    assert remove_identity_views(graph_module) == 1  # view(3, 8) is read by nobody afterwards
    reshapes = [n for n in graph_module.graph.nodes if n.target in (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)]
    assert len(reshapes) == 2 and all(n.args[0].op == "placeholder" for n in reshapes)
    x = torch.randn(4, 6)
    for actual, expected in zip(_run_fx(graph_module, x), fn(x)):
        torch.testing.assert_close(actual, expected)
