"""Dims derived from a user's `torch.export.Dim` read as expressions of its name, in the
inputs and the outputs: a derived Dim in the spec (`2*half`, `batch + 1`) names its root,
and sizes computed from a named dim (`2*batch`, `seq-1`) keep the name."""

from __future__ import annotations

import onnx
import pytest
import torch
from torch.export import Dim

from conftest import make_options


class Derived(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.cat([x, x], 0), x[1:], y + 1, x.reshape(-1)


def _dims(proto: onnx.ModelProto) -> dict[str, list[int | str]]:
    return {value.name: [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
            for value in [*proto.graph.input, *proto.graph.output]}


def _spec(case: str) -> dict:
    half, batch, seq = Dim("half", min=2), Dim("batch", min=2), Dim("seq", min=2)
    return {
        "named": {"x": {0: batch, 1: seq}, "y": {0: 2 * batch}},
        "derived": {"x": {0: 2 * half}, "y": {0: 4 * half}},
        "shifted": {"x": {0: batch + 1}, "y": {0: 2 * batch + 2}},
    }[case]


# the example's sizes, another size with the same relations, and the dims expected
CASES = {
    "named": ((4, 3), (8, 3), (6, 5), (12, 3),
              {"x": ["batch", "seq"], "y": ["2*batch", 3], "cat": ["2*batch", "seq"], "slice_1": ["batch-1", "seq"],
               "add": ["2*batch", 3], "reshape": ["batch*seq"]}),
    "derived": ((4, 3), (8, 3), (6, 3), (12, 3),
                {"x": ["2*half", 3], "y": ["4*half", 3], "cat": ["4*half", 3], "slice_1": ["2*half-1", 3],
                 "add": ["4*half", 3], "reshape": ["6*half"]}),
    "shifted": ((4, 3), (8, 3), (6, 3), (12, 3),
                {"x": ["batch+1", 3], "y": ["2*batch+2", 3], "cat": ["2*batch+2", 3], "slice_1": ["batch", 3],
                 "add": ["2*batch+2", 3], "reshape": ["3*batch+3"]}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_derived_dims_read_as_expressions_of_the_users_names(case, export_and_compare, tmp_path):
    x_shape, y_shape, other_x, other_y, expected = CASES[case]
    program = export_and_compare(
        Derived(), (torch.randn(*x_shape), torch.randn(*y_shape)),
        options=make_options(tmp_path, dynamic_shapes=_spec(case)),
        second_inputs=((torch.randn(*other_x), torch.randn(*other_y)), {}),
    )
    assert _dims(program.model_proto) == expected
