"""``aten.gelu`` (exact or tanh) as the standard ``Gelu`` (opset 20) instead of its formula."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fx2onnx.fx_passes.fused_kernels import operators  # noqa: F401 - registers torch.ops.fx2onnx.*
from fx2onnx.fx_passes.fused_kernels.editing import new_call
from fx2onnx.fx_passes.fused_kernels.matching import FusionRule, FusionTarget, Match, Refusal, Replacements, node_value


@dataclass(frozen=True)
class GeluMatch(Match):
    x: Any
    approximate: str


def match(node: torch.fx.Node, target: FusionTarget) -> GeluMatch | Refusal:
    x, approximate = node.args[0], node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    if node_value(x) is None or node_value(x).dtype != torch.float32:
        return Refusal(f"{getattr(node_value(x), 'dtype', 'unknown type')} (onnxruntime's Gelu runs float32 only)")
    return GeluMatch(node, x, approximate)


def replace(graph: torch.fx.Graph, found: GeluMatch) -> Replacements:
    with graph.inserting_before(found.anchor):
        fused = new_call(graph, torch.ops.fx2onnx.gelu.default, (found.x, found.approximate), found.anchor,
                         like=node_value(found.anchor))
    return [(found.anchor, fused)]


RULE = FusionRule("gelu", "Gelu", torch.ops.aten.gelu.default, 20, True, match, replace)
