"""squeeze as PyTorch does it at every size: a dim is removed only when its size is 1,
decided at run time for a size that is symbolic in the export (in the main graph and
inside module functions)."""

from __future__ import annotations

import torch
from torch import nn

import fx2onnx
from conftest import all_nodes, assert_outputs_close, make_options


class SqueezeOfDataDependentSize(nn.Module):
    def forward(self, d1: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        t = torch.zeros(d1[0], d2[0])
        return t.squeeze(0)


def test_squeeze_of_a_size_read_from_data(tmp_path):
    model = SqueezeOfDataDependentSize()
    program = fx2onnx.dynamo_export(model, torch.tensor([1]), torch.tensor([4]), export_options=make_options(tmp_path))
    for d1 in (1, 3):
        inputs = (torch.tensor([d1]), torch.tensor([4]))
        actual = program(*inputs)
        assert actual.shape == model(*inputs).shape == ((4,) if d1 == 1 else (3, 4))


class Inner(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.squeeze(0).relu()


class Squeezes(nn.Module):
    """Every overload of squeeze on dims that are dynamic, one inside a module function."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.inner(x) * 2, y.squeeze(), x.squeeze(-1), y.squeeze((0, 2))


def test_squeeze_of_dynamic_dims_matches_at_every_size(tmp_path):
    model = Squeezes()
    x, y = torch.rand(1, 4, 1), torch.rand(2, 1, 3)
    program = fx2onnx.dynamo_export(model, x, y, export_options=make_options(tmp_path, dynamic_shapes=True))
    proto = program.model_proto
    assert any("Inner" in f.name for f in proto.functions)
    function_ops = {n.op_type for f in proto.functions if "Inner" in f.name for n in f.node}
    assert "Squeeze" not in function_ops and "Compress" in function_ops  # decided at run time there too
    for xx, yy in [(x, y), (torch.rand(3, 4, 1), torch.rand(1, 5, 1)), (torch.rand(3, 4, 2), torch.rand(2, 2, 2)),
                   (torch.rand(1, 1, 1), torch.rand(1, 1, 1)), (torch.rand(2, 0, 1), torch.rand(1, 0, 1))]:
        actual, expected = program(xx, yy), model(xx, yy)
        assert [tuple(a.shape) for a in actual] == [tuple(e.shape) for e in expected]
        assert_outputs_close(actual, expected)


class StaticSqueezes(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.squeeze(0), x.squeeze(1)  # size 1: removed; size 3: PyTorch leaves it


def test_static_sizes_decide_at_export(tmp_path):
    model = StaticSqueezes()
    x = torch.rand(1, 3)
    program = fx2onnx.dynamo_export(model, x, export_options=make_options(tmp_path))
    ops = [node.op_type for node in all_nodes(program.model_proto)]
    assert ops.count("Squeeze") == 1 and "Compress" not in ops
    actual = program(x)
    assert [tuple(a.shape) for a in actual] == [(3,), (1, 3)]
    assert_outputs_close(actual, model(x))
