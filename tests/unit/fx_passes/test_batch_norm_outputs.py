"""Batch norm overloads called directly return what PyTorch's kernel returns: batch
statistics in training mode, empty saved statistics in evaluation mode."""

from __future__ import annotations

import pytest
import torch


class NativeBatchNorm(torch.nn.Module):
    def __init__(self, op, training: bool) -> None:
        super().__init__()
        self.op = op
        self.training_flag = training

    def forward(self, x, weight, bias, running_mean, running_var):
        # clones: PyTorch's kernel updates the running statistics in place in training
        return self.op(x, weight, bias, running_mean.clone(), running_var.clone(), self.training_flag, 0.1, 1e-3)


@pytest.mark.parametrize("training", [True, False], ids=["training", "eval"])
@pytest.mark.parametrize(
    "op", [torch.ops.aten.native_batch_norm.default, torch.ops.aten._native_batch_norm_legit.default], ids=["native", "legit"]
)
@pytest.mark.parametrize("shape", [(4, 3, 5), (6, 2)], ids=["3d", "2d"])
def test_batch_norm_outputs_match_pytorch(op, training, shape, export_and_compare) -> None:
    channels = shape[1]
    args = (torch.randn(*shape) * 3 + 1, torch.randn(channels), torch.randn(channels), torch.randn(channels), torch.rand(channels) + 0.5)
    program = export_and_compare(NativeBatchNorm(op, training), args)
    if not training:  # PyTorch saves no statistics in evaluation
        assert [tuple(t.shape) for t in program(*args)[1:]] == [(0,), (0,)]

