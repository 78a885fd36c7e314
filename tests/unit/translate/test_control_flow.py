"""Control flow (torch.cond, while_loop, scan, map) exported as ONNX If, Loop and Scan,
compared with PyTorch in onnxruntime on inputs that take each branch or iterate a
different number of times; every model passes the full ONNX checker."""

from __future__ import annotations

import copy
import inspect

import onnx_ir as ir
import pytest
import torch
from torch._higher_order_ops.map import map as torch_map
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

import fx2onnx
from conftest import all_nodes, assert_outputs_close, check_saved_model, make_options, op_types
from fx2onnx.translate.graph_builder import GraphBuilder
from fx2onnx.translate.module_functions import structural_key


def _export(model, args, tmp_path, **options):
    program = fx2onnx.dynamo_export(model, *args, export_options=make_options(tmp_path, **options))
    check_saved_model(program, tmp_path / "model.onnx")
    return program


def _compare(program, model, *inputs):
    for args in inputs:
        assert_outputs_close(program(*args), model(*args))


# -- cond -> If -----------------------------------------------------------------------------------
class SignBranches(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def positive(x: torch.Tensor) -> torch.Tensor:
            return x.sin() * 2

        def negative(x: torch.Tensor) -> torch.Tensor:
            return x.cos() - x.abs()

        return torch.cond(x.sum() > 0, positive, negative, (x,))


def test_cond_on_a_tensor_predicate_takes_each_branch(tmp_path) -> None:
    model = SignBranches()
    program = _export(model, (torch.randn(3, 4),), tmp_path)
    proto = program.model_proto
    (if_node,) = [n for n in proto.graph.node if n.op_type == "If"]
    branch_ops = {a.name: {n.op_type for n in a.g.node} for a in if_node.attribute}
    assert "Sin" in branch_ops["then_branch"] and "Cos" in branch_ops["else_branch"]
    _compare(program, model, (torch.ones(3, 4),), (-torch.ones(3, 4),), (torch.randn(3, 4),))


class ShapeBranches(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.shape[0] > 4, lambda x: x[:2] * 2, lambda x: x[1:3] + 1, (x,))


def test_cond_on_a_symbolic_shape_with_dynamic_sizes(tmp_path) -> None:
    model = ShapeBranches()
    program = _export(model, (torch.randn(6, 2),), tmp_path, dynamic_shapes=True)
    assert "If" in op_types(program.model_proto)
    _compare(program, model, (torch.randn(6, 2),), (torch.randn(3, 2),), (torch.randn(9, 2),))


class DifferentShapes(torch.nn.Module):
    """Branches whose outputs differ in size: the If output's shape is relaxed."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.shape[0] > 4, lambda x: x[:4] * 2, lambda x: x + 1, (x,))


def test_cond_with_branch_outputs_of_different_sizes(tmp_path) -> None:
    model = DifferentShapes()
    program = _export(model, (torch.randn(6, 2),), tmp_path, dynamic_shapes=True)
    _compare(program, model, (torch.randn(6, 2),), (torch.randn(3, 2),))


class Nested(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        def outer_true(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.cond(y.mean() > 0, lambda x, y: x + y, lambda x, y: x - y, (x, y)) * 3

        def outer_false(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x * y

        return torch.cond(x.sum() > 0, outer_true, outer_false, (x, y))


def test_nested_conds_reach_every_path(tmp_path) -> None:
    model = Nested()
    ones = torch.ones(2, 3)
    program = _export(model, (ones, ones * 2), tmp_path)  # two tensors: torch.export dedups aliases
    ifs = [n for n in all_nodes(program.model_proto) if n.op_type == "If"]
    assert len(ifs) == 2
    _compare(program, model, (ones, ones), (ones, -ones), (-ones, ones))


class BufferUpdatingBranches(torch.nn.Module):
    """Each branch computes a new value of the buffer; torch.export keeps it functional."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def grow(x: torch.Tensor, total: torch.Tensor):
            return x * 2, total + x

        def shrink(x: torch.Tensor, total: torch.Tensor):
            return x - 1, total - 1

        y, total = torch.cond(x.sum() > 0, grow, shrink, (x, self.total))
        self.total.copy_(total)
        return y + self.total


def test_cond_whose_branches_update_a_buffer(tmp_path) -> None:
    original = BufferUpdatingBranches()
    original.total.copy_(torch.tensor([1.0, 2.0, 3.0]))
    program = _export(copy.deepcopy(original), (torch.randn(3),), tmp_path)
    assert [(m.kind, m.target) for m in program.mutation_outputs] == [("buffer", "total")]
    (if_node,) = [n for n in program.model_proto.graph.node if n.op_type == "If"]
    assert "total.mutated" in if_node.output  # the new value leaves the If
    for x in (torch.ones(3), -torch.ones(3), torch.tensor([2.0, -1.0, 0.5])):
        model, written = copy.deepcopy(original), copy.deepcopy(original)
        expected = model(x)  # updates model.total
        actual = program(x, write_back=True, module=written)
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(written.total, model.total)
        assert not torch.equal(model.total, original.total)


class DecomposedInABranch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # aten.rms_norm has no ONNX function: PyTorch's decomposition is used, in the branch
        return torch.cond(x.sum() > 0, lambda x: torch.nn.functional.rms_norm(x, (3,)), lambda x: x * 2, (x,))


def test_operators_inside_branches_are_decomposed_like_the_main_graphs(tmp_path) -> None:
    model = DecomposedInABranch()
    program = _export(model, (torch.randn(2, 3),), tmp_path)
    _compare(program, model, (torch.ones(2, 3),), (-torch.ones(2, 3),))


# -- while_loop -> Loop ---------------------------------------------------------------------------
class CountTo(torch.nn.Module):
    def forward(self, bound: torch.Tensor, x: torch.Tensor):
        def keep_going(i: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return i < bound

        def step(i: torch.Tensor, x: torch.Tensor):
            return i + 1, x * 2 + 1

        return while_loop(keep_going, step, (torch.zeros((), dtype=torch.int64), x))


def test_while_loop_counts_to_a_data_dependent_bound(tmp_path) -> None:
    model = CountTo()
    program = _export(model, (torch.tensor(4), torch.randn(3)), tmp_path)
    assert "Loop" in op_types(program.model_proto)
    x = torch.randn(3)
    # zero iterations (the condition is false before the first), a few, more
    _compare(program, model, (torch.tensor(0), x), (torch.tensor(3), x), (torch.tensor(7), x))


class TwoTensorsAndACounter(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor):
        def keep_going(n: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return (a.sum() < 50) & (n < 10)

        def step(n: torch.Tensor, a: torch.Tensor, b: torch.Tensor):
            return n + 1, a + b, b * 1.5

        return while_loop(keep_going, step, (torch.tensor(0), a, b))


def test_while_loop_carrying_two_tensors_and_a_counter(tmp_path) -> None:
    model = TwoTensorsAndACounter()
    program = _export(model, (torch.ones(2, 2), torch.ones(2, 2)), tmp_path)
    _compare(
        program,
        model,
        (torch.ones(2, 2), torch.ones(2, 2)),  # stops on the sum
        (torch.zeros(2, 2), torch.full((2, 2), 0.01)),  # stops on the counter
        (torch.full((2, 2), 20.0), torch.ones(2, 2)),  # never enters
    )


class LoopUpdatesABuffer(torch.nn.Module):
    """The loop carries the buffer's value; torch.export keeps the update functional."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.ones(3))

    def forward(self, steps: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        def keep_going(i, state):
            return i < steps

        def step(i, state):
            return i + 1, state * 0.5 + x

        _, state = while_loop(keep_going, step, (torch.tensor(0), self.state))
        self.state.copy_(state)
        return state.sum()


def test_while_loop_whose_carried_state_updates_a_buffer(tmp_path) -> None:
    original = LoopUpdatesABuffer()
    program = _export(copy.deepcopy(original), (torch.tensor(2), torch.randn(3)), tmp_path)
    assert [(m.kind, m.target) for m in program.mutation_outputs] == [("buffer", "state")]
    producer = {out: n.op_type for n in program.model_proto.graph.node for out in n.output}
    assert producer["state.mutated"] == "Loop"  # the new value leaves the Loop
    for steps in (0, 1, 4):
        model, written = copy.deepcopy(original), copy.deepcopy(original)
        args = (torch.tensor(steps), torch.randn(3))
        torch.testing.assert_close(program(*args, write_back=True, module=written), model(*args))
        torch.testing.assert_close(written.state, model.state)


# -- scan / map -> Scan ---------------------------------------------------------------------------
class CumulativeSum(torch.nn.Module):
    def __init__(self, reverse: bool = False, dim: int = 0) -> None:
        super().__init__()
        self.reverse, self.dim = reverse, dim

    def forward(self, xs: torch.Tensor):
        def add(total: torch.Tensor, x: torch.Tensor):
            total = total + x
            return total, total.clone()

        init = torch.zeros_like(xs.select(self.dim, 0))
        return scan(add, init, xs, dim=self.dim, reverse=self.reverse)


@pytest.mark.parametrize(("reverse", "dim"), [(False, 0), (True, 0), (False, 1)])
def test_scan_computes_a_cumulative_sum(tmp_path, reverse, dim) -> None:
    model = CumulativeSum(reverse, dim)
    xs = torch.randn(5, 3)
    program = _export(model, (xs,), tmp_path, dynamic_shapes=True)
    assert "Scan" in op_types(program.model_proto)
    total, stacked = program(xs)
    torch.testing.assert_close(stacked, (xs.flip(dim).cumsum(dim).flip(dim) if reverse else xs.cumsum(dim)))
    _compare(program, model, (xs,), (torch.randn(8, 3),))


class TinyRNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input = torch.nn.Linear(4, 6)
        self.hidden = torch.nn.Linear(6, 6)

    def forward(self, sequence: torch.Tensor, state: torch.Tensor):
        def cell(h: torch.Tensor, x: torch.Tensor):
            h = torch.tanh(self.input(x) + self.hidden(h))
            return h, h * 1.0

        return scan(cell, state, sequence)


def test_scan_runs_an_rnn_over_time(tmp_path) -> None:
    model = TinyRNN().eval()
    program = _export(model, (torch.randn(7, 2, 4), torch.zeros(2, 6)), tmp_path, module_functions=False)
    _compare(program, model, (torch.randn(7, 2, 4), torch.randn(2, 6)))


class MapRows(torch.nn.Module):
    def forward(self, xs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch_map(lambda x, y: x * y + x.sum(), xs, y)


def test_map_becomes_a_scan_without_state(tmp_path) -> None:
    model = MapRows()
    program = _export(model, (torch.randn(4, 3), torch.randn(3)), tmp_path)
    assert "Scan" in op_types(program.model_proto)
    _compare(program, model, (torch.randn(4, 3), torch.randn(3)))


# -- module functions -------------------------------------------------------------------------------
class Gate(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: self.linear(x).relu(), lambda x: x * 0.5, (x,))


class TwoGates(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = Gate(), Gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x) - 0.25)


def test_a_module_with_cond_stays_one_function(tmp_path) -> None:
    model = TwoGates().eval()
    program = _export(model, (torch.randn(2, 4),), tmp_path)
    proto = program.model_proto
    # both gates are structurally identical: one definition (its If included), two calls
    (gate,) = [f for f in proto.functions if "Gate" in f.name and "TwoGates" not in f.name]
    assert any(n.op_type == "If" for n in gate.node)
    assert [n.op_type for n in proto.graph.node].count(gate.name) == 2
    assert not any(n.op_type == "If" for n in proto.graph.node)
    _compare(program, model, (torch.ones(2, 4),), (-torch.ones(2, 4),), (torch.randn(2, 4),))


# -- diagnostics ----------------------------------------------------------------------------------
@torch.library.custom_op("fx2onnx_control_flow_test::mystery", mutates_args=())
def _mystery(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@_mystery.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class UnsupportedInBranch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def odd(x: torch.Tensor) -> torch.Tensor:
            return torch.ops.fx2onnx_control_flow_test.mystery(x) + 1  # the unsupported line

        return torch.cond(x.sum() > 0, odd, lambda x: x - 1, (x,))


def _line_of(marker: str) -> int:
    source, first = inspect.getsourcelines(UnsupportedInBranch.forward)
    return first + next(i for i, text in enumerate(source) if marker in text)


def _the_one_error(model, tmp_path):
    with pytest.raises(fx2onnx.OnnxExporterError) as raised:
        fx2onnx.dynamo_export(model, torch.randn(3), export_options=make_options(tmp_path))
    (error,) = raised.value.diagnostic_context.errors()
    assert error.rule.id == "FXE0012" and "mystery" in error.message
    assert error.location is not None and error.location.path == __file__
    return error


def test_an_unsupported_op_in_a_branch_is_reported_at_its_line(tmp_path) -> None:
    # A strict capture keeps the branch's own frame: the error points at the op's line.
    program = torch.export.export(UnsupportedInBranch(), (torch.randn(3),), strict=True)
    error = _the_one_error(program, tmp_path)
    assert error.location.line == _line_of("the unsupported line")


def test_an_unsupported_op_in_a_branch_of_a_non_strict_capture_points_at_the_cond(tmp_path) -> None:
    # torch.export's non-strict capture keeps no frame of the branch function: the
    # innermost user frame is the torch.cond call.
    error = _the_one_error(UnsupportedInBranch(), tmp_path)
    assert error.location.line == _line_of("return torch.cond(")


def _branchy_function(name_prefix: str, branch_op: str) -> ir.Graph:
    builder = GraphBuilder(name=f"{name_prefix}_f")
    x = builder.add_input(f"{name_prefix}_x", ir.DataType.FLOAT, ir.Shape([2]))
    (flag,) = builder.add_node("", "ReduceMax", [x])
    (positive,) = builder.add_node("", "Greater", [flag, builder.constant(0.0, ir.DataType.FLOAT)])
    branches = []
    for label, op in (("then", branch_op), ("else", "Neg")):
        sub = builder.subgraph(f"{name_prefix}_{label}")
        (out,) = sub.add_node("", op, [x])  # reads the function's input by name
        out.dtype, out.shape = ir.DataType.FLOAT, ir.Shape([2])
        sub.set_outputs([out])
        branches.append(sub.graph)
    outputs = builder.add_node("", "If", [positive], [ir.AttrGraph("then_branch", branches[0]), ir.AttrGraph("else_branch", branches[1])])
    builder.set_outputs(outputs)
    return builder.graph


def test_structural_key_reads_subgraphs_without_their_names() -> None:
    same = structural_key(_branchy_function("a", "Abs")) == structural_key(_branchy_function("b", "Abs"))
    different = structural_key(_branchy_function("a", "Abs")) != structural_key(_branchy_function("a", "Relu"))
    assert same and different


def test_branches_are_diagnostic_scopes_of_their_own(tmp_path) -> None:
    import logging

    from diagnostics import DiagnosticOptions, rules
    from sarif_checks import validate_sarif

    options = make_options(tmp_path, diagnostic_options=DiagnosticOptions(verbosity_level=logging.DEBUG))
    program = fx2onnx.dynamo_export(SignBranches(), torch.randn(3, 4), export_options=options)
    diagnostics = program.diagnostic_context.diagnostics
    branches = [d for d in diagnostics if d.rule is rules.FX_GRAPH_TO_ONNX and "branch of cond" in d.message]
    assert sorted(d.message.split(" branch")[0][-4:] for d in branches) == ["else", "then"]
    # each branch scope is located at the torch.cond call in the user's code
    assert all(d.location is not None and d.location.path == __file__ for d in branches)
    # the nodes of a branch are translated (and located) one by one, like the main graph's
    sin = next(d for d in diagnostics if d.rule is rules.FX_NODE_TO_ONNX and "aten.sin" in d.message)
    assert sin.location is not None and sin.location.path == __file__
    program.save_diagnostics(tmp_path / "report.sarif")
    validate_sarif(tmp_path / "report.sarif")
