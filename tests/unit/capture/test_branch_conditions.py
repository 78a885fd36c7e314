"""Branches the model's code takes on expressions of its dynamic sizes hold only under a
condition that neither torch.export nor the ONNX model checks: the export warns with the
line and the condition."""

from __future__ import annotations

import inspect

import torch

from conftest import export_and_compare_impl, make_options


class PaddedWindows(torch.nn.Module):
    """Doubles the input when its height padded to a multiple of 4 is more than 8 (the
    form of a windowed attention that shifts only when there is more than one window)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        height = x.shape[2]
        padded = height + (4 - height % 4) % 4
        if padded > 8:
            return x * 2
        return x + 1


class BoundedHeight(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[2] > 4:  # a bound on one dim: the dim's range
            return x * 2
        return x + 1


def _branch_warnings(program) -> list[str]:
    return [w.message for w in program.warnings if "branches on the dynamic input sizes" in (w.message or "")]


def test_a_branch_on_an_expression_of_dynamic_dims_is_a_warning_naming_the_line(tmp_path):
    model = PaddedWindows().eval()
    program = export_and_compare_impl(model, (torch.randn(2, 3, 10, 5),), options=make_options(tmp_path, dynamic_shapes=True),
                                      tmp_path=tmp_path, second_inputs=((torch.randn(3, 3, 13, 4),), {}))
    assert str(program.model.graph.inputs[0].shape[2]) == "x_dim_2"
    found = _branch_warnings(program)
    source, first = inspect.getsourcelines(PaddedWindows.forward)
    line = first + next(i for i, text in enumerate(source) if "if padded > 8" in text)
    assert len(found) == 1, found
    assert f"{__file__}:{line}" in found[0] and "x.shape[2]" in found[0] and "> 8" in found[0]
    # the warning is due: where the condition fails, the ONNX model computes the other branch
    small = torch.randn(2, 3, 6, 5)
    assert torch.allclose(program(small), small * 2) and not torch.allclose(model(small), small * 2)


def test_a_bound_on_one_dynamic_dim_is_no_such_warning(tmp_path):
    program = export_and_compare_impl(BoundedHeight().eval(), (torch.randn(2, 3, 10, 5),),
                                      options=make_options(tmp_path, dynamic_shapes=True), tmp_path=tmp_path,
                                      second_inputs=((torch.randn(2, 3, 7, 5),), {}))
    assert str(program.model.graph.inputs[0].shape[2]) == "x_dim_2"
    assert _branch_warnings(program) == []
