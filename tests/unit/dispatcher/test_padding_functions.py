"""aten::pad in every mode, compared with PyTorch in onnxruntime (negative pads and empty
dims included: the cases where ONNX Pad's edge and wrap modes fail in onnxruntime)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import all_nodes

CASES = [
    # (input shape, pads, mode)
    ((2, 3, 4), (1, 2), "circular"),
    ((0, 3, 3), (1, 2), "circular"),  # empty batch
    ((1, 3, 4, 4), (-1, 1, -2, 1), "circular"),  # crop, then wrap
    ((2, 2, 5, 5), (2, -1, 0, 3), "circular"),
    ((5, 3, 4, 4), (-4, 5, 0, 0), "replicate"),  # the whole side cropped before padding
    ((2, 6, 4, 4), (5, -4, -4, 3), "replicate"),
    ((2, 3, 4), (2, 3), "replicate"),
    ((2, 3, 4, 4), (1, 2, 2, 1), "reflect"),
    ((2, 3, 4), (-1, 2), "constant"),
]


class Pad(torch.nn.Module):
    def __init__(self, pads, mode: str, value: float | None = None) -> None:
        super().__init__()
        self.pads, self.mode, self.value = pads, mode, value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, self.pads, mode=self.mode, value=self.value)


@pytest.mark.parametrize("shape, pads, mode", CASES)
def test_pad_matches_pytorch(shape, pads, mode, export_and_compare) -> None:
    x = torch.randn(shape)
    program = export_and_compare(Pad(pads, mode), (x,))
    op_types = {node.op_type for node in all_nodes(program.model_proto)}
    if mode in ("replicate", "circular"):
        assert "Gather" in op_types and "Pad" not in op_types
    else:
        assert "Pad" in op_types


def test_constant_pad_value_and_integer_tensors(export_and_compare) -> None:
    export_and_compare(Pad((1, 1, 2, 0), "constant", 3.0), (torch.arange(12).reshape(3, 4),))
    export_and_compare(Pad((2, -1), "circular"), (torch.arange(12).reshape(3, 4),))
