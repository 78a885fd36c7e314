"""The optimization stage (`ExportOptions(optimize=True)`, the default)."""

from __future__ import annotations

import collections

import onnx
import torch
from torch import nn

from conftest import all_nodes, make_options


class TwoNorms(nn.Module):
    """Two LayerNorms and two Linears initialized alike: equal weights under different names."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.LayerNorm(8), nn.LayerNorm(8)
        self.up, self.down = nn.Linear(8, 8), nn.Linear(8, 8)
        with torch.no_grad():
            self.down.weight.copy_(self.up.weight)
            self.down.bias.copy_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.down(self.first(self.up(x))))


class NoOps(nn.Module):
    """Operations that are identities for these inputs: x * 1, + 0, a cast to the same
    dtype, inference dropout, reshape to the same shape and a double transpose."""

    def __init__(self) -> None:
        super().__init__()
        self.dropout = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dropout(x * torch.ones(()) + torch.zeros(()))
        y = y.to(torch.float32).reshape(x.shape).transpose(0, 1).transpose(0, 1)
        return torch.relu(y)


def _counts(model: onnx.ModelProto) -> collections.Counter[str]:
    return collections.Counter(node.op_type for node in all_nodes(model))


def test_equal_weights_keep_their_own_names(export_and_compare, tmp_path) -> None:
    # Equal-valued weights (fresh LayerNorms, copied Linears) are distinct parameters: the
    # optimizer must not merge them, or their names (what a checkpoint is loaded by) are lost.
    model = TwoNorms().eval()
    program = export_and_compare(model, (torch.randn(3, 8),), options=make_options(tmp_path, optimize=True))
    names = {initializer.name for initializer in program.model_proto.graph.initializer}
    assert {name for name, _ in model.named_parameters()} <= names


def test_no_op_nodes_are_removed(export_and_compare, tmp_path) -> None:
    x = torch.randn(4, 6)
    plain = export_and_compare(NoOps().eval(), (x,), options=make_options(tmp_path, optimize=False))
    optimized = export_and_compare(NoOps().eval(), (x,), options=make_options(tmp_path, optimize=True))
    before, after = _counts(plain.model_proto), _counts(optimized.model_proto)
    assert sum(after.values()) < sum(before.values())
    for op_type in ("Mul", "Add", "Transpose", "Dropout", "Reshape"):
        assert after[op_type] == 0, (op_type, after)
    assert after["Relu"] == 1
