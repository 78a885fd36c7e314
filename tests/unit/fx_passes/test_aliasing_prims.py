"""View primitives a node-by-node decomposition leaves (`std` keeps its reduced dim with
`prims::broadcast_in_dim`) are written as ATen views before the whole program is
re-traced, whose functionalization refuses a non-ATen operator that returns an alias."""

from __future__ import annotations

import pytest
import torch

import fx2onnx
from diagnostics import rules
from fx2onnx.fx_passes.aliasing_prims import VIEWS_IN_ATEN

_prims = torch.ops.prims


class _StdIntoAView(torch.nn.Module):
    """`std` (decomposed node by node into `prims::var` and `prims::broadcast_in_dim`) added
    in place into a view of a stacked tensor, whose in-place add needs the whole program
    re-traced (Gemma 3n's sparse MLP and its corrected predictions, in small)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.stack([x, x])[0]
        y[1:] += torch.std(x[1:], dim=-1, keepdim=True, unbiased=False)
        return y


def test_std_beside_a_whole_program_retrace_exports(export_and_compare):
    x = torch.randn(3, 4, 8)
    # dynamic dims: the views' sizes stay symbolic through the rewrite
    program = export_and_compare(_StdIntoAView(), (x,), second_inputs=((torch.randn(5, 2, 6),), {}),
                                 options=fx2onnx.ExportOptions(dynamic_shapes=True))
    retraced = [d for d in program.diagnostic_context.diagnostics
                if d.rule is rules.FX_PASS and "re-traced" in (d.message or "")]
    assert retraced, "the case needs the whole program re-traced"
    assert "ReduceMean" in {node.op_type for node in program.model_proto.graph.node} | {
        node.op_type for function in program.model_proto.functions for node in function.node}


@pytest.mark.parametrize(("prim", "args"), [
    (_prims.broadcast_in_dim.default, (torch.randn(2, 3), [2, 4, 3], [0, 2])),
    (_prims.broadcast_in_dim.default, (torch.randn(3), [2, 3, 5], [1])),
    (_prims.collapse_view.default, (torch.randn(2, 3, 4, 5), 1, 3)),
    (_prims.collapse_view.default, (torch.randn(2, 3, 4), 1, 1)),
    (_prims.split_dim.default, (torch.randn(2, 6, 3), 1, 2)),
    (_prims.squeeze.default, (torch.randn(2, 1, 3, 1), [1, 3])),
    (_prims.transpose.default, (torch.randn(2, 3, 4), [2, 0, 1])),
    (_prims.view_of.default, (torch.randn(2, 3),)),
    (_prims.view_of_dtype.default, (torch.randn(2, 4), torch.int32)),
])
def test_each_view_in_aten_equals_its_primitive(prim, args):
    assert prim in VIEWS_IN_ATEN
    expected = prim(*args)
    actual = VIEWS_IN_ATEN[prim](*args)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
