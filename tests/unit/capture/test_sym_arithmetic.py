"""Arithmetic on symbolic sizes: SymFloat, sym_* helpers, true division and math on
sizes, each exported with dynamic shapes and compared with PyTorch at two sizes."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from conftest import make_options

from fx2onnx.capture.dynamic_dims.switches import symbolic_math


class SizeArithmetic(torch.nn.Module):
    def __init__(self, function: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.function = function

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(x)


CASES = {
    "true_division": lambda x: x * (1.0 / x.size(1)),
    "sym_float": lambda x: x * torch.sym_float(x.size(1)) + torch.sym_float(x.size(0)) / 2,
    "sym_int": lambda x: torch.full((x.size(0), torch.sym_int(torch.sym_float(x.size(1)) * 1.5)), 2.0),
    "sym_max": lambda x: x[:, : torch.sym_max(x.size(1) - 3, 1)].sum(-1),
    "sym_min": lambda x: x[:, : torch.sym_min(x.size(1), x.size(0))].sum(-1),
    "sym_sqrt": lambda x: x * torch.sym_sqrt(x.size(1)),
    "math_sqrt": lambda x: x / math.sqrt(x.size(1)),
    "sym_ite": lambda x: x * torch.sym_ite(x.size(0) > x.size(1), x.size(0), x.size(1)),
    "sym_sum": lambda x: x * torch.sym_sum([x.size(0), x.size(1), 1]),
    "floor_ceil_of_division": lambda x: torch.zeros(math.floor(x.size(1) / 3), math.ceil(x.size(1) / 4)),
    "mixed_int_float_max": lambda x: x * torch.sym_max(x.size(1) / 2, 2),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_size_arithmetic_stays_dynamic(name: str, export_and_compare, tmp_path) -> None:
    model = SizeArithmetic(CASES[name])
    program = export_and_compare(
        model, (torch.randn(4, 6),), options=make_options(tmp_path, dynamic_shapes=True),
        second_inputs=((torch.randn(3, 11),), {}),
    )
    dims = program.model_proto.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param for d in dims] == ["x_dim_0", "x_dim_1"]


def test_sizes_computed_in_float_arithmetic_are_python_doubles(export_and_compare, tmp_path) -> None:
    """`int(n * (128 / n))` is 127 in Python for n = 103 (doubles round below 128): the
    ONNX model computes sizes from floats in double, as Python does (float32 gives 128)."""
    assert int(103 * (128 / 103)) == 127
    model = SizeArithmetic(lambda x: torch.zeros(x.size(0), torch.sym_int(x.size(1) * (128 / x.size(1)))))
    program = export_and_compare(model, (torch.randn(2, 10),), options=make_options(tmp_path, dynamic_shapes=True),
                                 second_inputs=((torch.randn(2, 103),), {}))
    assert program(torch.randn(2, 103)).shape == (2, 127)


def test_symbolic_math_restores_math_and_keeps_plain_numbers() -> None:
    original = math.sqrt
    with symbolic_math():
        assert math.sqrt(16) == 4.0
        assert math.sqrt is not original
    assert math.sqrt is original
