"""cross_entropy with class-probability targets (and class indices, torchlib's path)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import all_nodes


class CrossEntropy(torch.nn.Module):
    def __init__(self, **options) -> None:
        super().__init__()
        self.options = options

    def forward(self, logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, target, weight=weight, **self.options)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape", [(4, 5), (2, 5, 3, 2), (5,)])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_probability_targets(shape, reduction, label_smoothing, export_and_compare) -> None:
    logits = torch.randn(shape)
    target = torch.softmax(torch.randn(shape), dim=1 if len(shape) > 1 else 0)
    weight = torch.rand(5) + 0.5
    model = CrossEntropy(reduction=reduction, label_smoothing=label_smoothing)
    export_and_compare(model, (logits, target, weight))


def test_class_index_targets_keep_their_function(export_and_compare) -> None:
    program = export_and_compare(CrossEntropy(reduction="mean"), (torch.randn(4, 5), torch.tensor([0, 3, 4, 1]), torch.rand(5)))
    assert "SoftmaxCrossEntropyLoss" in {node.op_type for node in all_nodes(program.model_proto)}
