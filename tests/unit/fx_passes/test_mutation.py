"""Mutation and aliasing: in-place ops on intermediates and views, mutated inputs and
buffers. ONNX Runtime's outputs and the written-back values must equal PyTorch's."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import fx2onnx


def _options(**kwargs: Any) -> fx2onnx.ExportOptions:
    return fx2onnx.ExportOptions(failure_report_path=None, **kwargs)


def _clone(values: tuple) -> tuple:
    return tuple(v.clone() if isinstance(v, torch.Tensor) else v for v in values)


def _check(model: torch.nn.Module, *inputs: Any, options: fx2onnx.ExportOptions | None = None, others: list[tuple] = ()) -> fx2onnx.ONNXProgram:
    """Export, then for each input set compare outputs and mutated inputs with PyTorch."""
    exported_with = copy.deepcopy(model)
    program = fx2onnx.dynamo_export(exported_with, *_clone(inputs), export_options=options or _options())
    for case in [inputs, *others]:
        eager_inputs, onnx_inputs = _clone(case), _clone(case)
        expected = copy.deepcopy(model)(*eager_inputs)
        actual = program(*onnx_inputs, write_back=True)
        torch.testing.assert_close(actual, expected)
        for got, want in zip(onnx_inputs, eager_inputs):
            torch.testing.assert_close(got, want, msg="the written-back input differs from PyTorch's")
    return program


class AddInPlaceOnIntermediate(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.add_(1.0)
        y.mul_(y)
        return y


def test_add_on_intermediate() -> None:
    _check(AddInPlaceOnIntermediate(), torch.randn(3, 4))


class SliceAssign(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y[:, 1:3] = 0
        y[0] = 5.0
        return y


def test_slice_assignment_static() -> None:
    _check(SliceAssign(), torch.randn(3, 5))


class SliceAssignDynamic(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y[:, y.size(0):] = 0
        return y


def test_slice_assignment_dynamic_bounds() -> None:
    _check(SliceAssignDynamic(), torch.randn(3, 7), options=_options(dynamic_shapes=True), others=[(torch.randn(4, 9),)])


class IndexPut(torch.nn.Module):
    def __init__(self, accumulate: bool) -> None:
        super().__init__()
        self.accumulate = accumulate

    def forward(self, x: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y.index_put_((index,), values, accumulate=self.accumulate)
        return y


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put(accumulate: bool) -> None:
    index = torch.tensor([0, 2, 2]) if accumulate else torch.tensor([0, 2])
    values = torch.randn(len(index), 4)
    _check(IndexPut(accumulate), torch.randn(3, 4), index, values)


class CopyIntoView(torch.nn.Module):
    def forward(self, x: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        y = torch.zeros(4, 6)
        y[1:3, ::2].copy_(src)
        y.diagonal().copy_(x[0, :4])
        return y + 1


def test_copy_into_view() -> None:
    _check(CopyIntoView(), torch.randn(2, 6), torch.randn(2, 3))


class MaskedFill(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y.masked_fill_(y > 0, -1.0)
        return y


def test_masked_fill() -> None:
    _check(MaskedFill(), torch.randn(3, 4))


class MutateInputThroughView(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.view(3, 2, -1).add_(2.0)
        return x


def test_input_mutated_through_view_is_written_back() -> None:
    x = torch.randn(3, 8)
    program = _check(MutateInputThroughView(), x)
    (mutation,) = program.mutation_outputs
    assert (mutation.kind, mutation.target) == ("user_input", "x")
    assert mutation.onnx_name == "x.mutated"
    assert mutation.onnx_name in [o.name for o in program.model_proto.graph.output]
    # without write_back the given tensor is untouched
    given = x.clone()
    program(given)
    assert torch.equal(given, x)


class Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count += 1
        return x * self.count


def test_buffer_counter_written_back_to_module() -> None:
    model = Counter()
    x = torch.randn(2, 3)
    program = fx2onnx.dynamo_export(copy.deepcopy(model), x, export_options=_options())
    assert [(m.kind, m.target, m.onnx_name) for m in program.mutation_outputs] == [("buffer", "count", "count.mutated")]
    target = copy.deepcopy(model)
    expected = model(x)
    actual = program(x, write_back=True, module=target)
    torch.testing.assert_close(actual, expected)
    assert int(target.count) == int(model.count) == 1


def test_batchnorm_training_updates_running_statistics() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).train()
    x = torch.randn(8, 4)
    reference = copy.deepcopy(model)
    program = fx2onnx.dynamo_export(copy.deepcopy(model), x, export_options=_options())
    targets = {m.target for m in program.mutation_outputs}
    assert {"1.running_mean", "1.running_var", "1.num_batches_tracked"} <= targets
    written = copy.deepcopy(model)
    actual = program(x, write_back=True, module=written)
    torch.testing.assert_close(actual, reference(x))
    for name, buffer in reference.named_buffers():
        torch.testing.assert_close(dict(written.named_buffers())[name], buffer, msg=name)


class LoopInPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.zeros_like(x)
        for i in range(x.shape[0]):
            y[i] += x[i] * i
            y[i:].mul_(1.5)
        return y


def test_in_place_updates_in_python_loop() -> None:
    _check(LoopInPlace(), torch.randn(4, 3))


class AppendAndStack(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs = []
        h = torch.zeros(x.shape[1])
        for step in range(x.shape[0]):
            h = torch.tanh(h + x[step])
            outputs.append(h)
        return torch.stack(outputs)


def test_list_appended_in_loop_and_stacked() -> None:
    _check(AppendAndStack(), torch.randn(5, 3))


# -- aten-level GraphModules that still hold in-place ops ------------------------------


def _aten_graph(fn: Any, *inputs: torch.Tensor) -> torch.fx.GraphModule:
    return make_fx(fn)(*inputs)


def _slice_add(x: torch.Tensor) -> torch.Tensor:
    y = x * 1
    y[:, 1:].add_(3.0)
    y.select(0, 0).fill_(-2.0)
    return y


def _mutate_input(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    x.view(-1).index_put_((index,), torch.tensor(9.0), accumulate=True)
    x.diagonal().mul_(2.0)
    return x.sum(0)


@pytest.mark.parametrize("fn", [_slice_add, _mutate_input], ids=lambda f: f.__name__)
def test_graph_module_with_in_place_ops(fn: Any) -> None:
    inputs = (torch.randn(3, 3),) if fn is _slice_add else (torch.randn(3, 3), torch.tensor([0, 4, 4]))
    graph_module = _aten_graph(fn, *_clone(inputs))
    assert any(
        n.op == "call_function" and n.target._schema.is_mutable for n in graph_module.graph.nodes if n.op == "call_function"
    ), "the test graph must hold in-place ops"
    program = fx2onnx.dynamo_export(graph_module, *_clone(inputs), export_options=_options())
    eager_inputs, onnx_inputs = _clone(inputs), _clone(inputs)
    expected = fn(*eager_inputs)
    actual = program(*onnx_inputs, write_back=True)
    torch.testing.assert_close(actual, expected)
    for got, want in zip(onnx_inputs, eager_inputs):
        torch.testing.assert_close(got, want)


class StridedAndIndexedViews(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y.as_strided((2, 2), (1, 3), 1).add_(1.0)
        y[torch.tensor([0, 2])] *= 3
        y.diagonal(1).sub_(4.0)
        return y


def test_as_strided_index_and_diagonal_views() -> None:
    _check(StridedAndIndexedViews(), torch.randn(3, 3))
