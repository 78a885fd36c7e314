"""Validation before success: the final model passes ONNX's checker and strict inference.

An export that would hand back a model ONNX Runtime refuses fails instead, with an error
diagnostic naming the ONNX node, its op and the user's source line of the FX node that
made it. Weights are left out of the checked copy (initializers become typed graph
inputs), so the check costs about as much for a 7B model as for a small one.
"""

from __future__ import annotations

import re

import onnx
import onnx_ir as ir
import torch

from diagnostics import DiagnosticContext, Level, rules
from dispatcher.fx_nodes import node_location, node_stack
from fx2onnx.onnx_passes.legalize_types import METADATA_KEY
from fx2onnx.onnx_passes.fake_weights import proto_with_weights_as_inputs
from fx2onnx.onnx_passes.model_graphs import model_nodes

_NODE_NAME = re.compile(r"node name: ([^)\n]*)\)|name: (\S+) OpType: (\S+)")


def weightless_proto(model: ir.Model) -> onnx.ModelProto:
    """The model as a proto whose initializers are typed graph inputs (no weight data:
    cheap for large models, and possible for fake-mode exports)."""
    return proto_with_weights_as_inputs(model)


def validate_model(model: ir.Model, graph_module: torch.fx.GraphModule | None, context: DiagnosticContext) -> bool:
    """Check ``model`` (functions included); record an error diagnostic per problem.

    Returns True when the model is valid.
    """
    proto = weightless_proto(model)
    try:
        onnx.checker.check_model(proto)
        # No data propagation: ONNX's propagates wrong shapes through Slice/Concat of
        # shapes (unflatten) and would reject valid models.
        onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True, data_prop=False)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        _record_invalid(str(error), model, graph_module, context)
        return False
    return True


def _record_invalid(text: str, model: ir.Model, graph_module: torch.fx.GraphModule | None, context: DiagnosticContext) -> None:
    onnx_node = None
    for match in _NODE_NAME.finditer(text):
        name = (match.group(1) or match.group(2) or "").strip()
        onnx_node = _find_node(model, name) or onnx_node
        if onnx_node is not None:
            break
    fx_node = fx_node_of(onnx_node, graph_module) if onnx_node is not None else None
    reason = " ".join(text.split())
    if fx_node is not None:
        reason += f" The node comes from FX node '{fx_node.name}' ({fx_node.op} {fx_node.target})."
    context.record(
        rules.MODEL_VALIDATION,
        Level.ERROR,
        node=onnx_node.name if onnx_node is not None else "?",
        op_type=onnx_node.op_type if onnx_node is not None else "?",
        reason=reason,
        location=node_location(fx_node) if fx_node is not None else None,
        stack=node_stack(fx_node) if fx_node is not None else None,
        properties={
            "onnx_node": onnx_node.name if onnx_node is not None else None,
            "op_type": onnx_node.op_type if onnx_node is not None else None,
            "fx_node": fx_node.name if fx_node is not None else None,
        },
    )


def _find_node(model: ir.Model, name: str) -> ir.Node | None:
    return next((node for node in model_nodes(model) if node.name == name), None)


def fx_node_of(onnx_node: ir.Node, graph_module: torch.fx.GraphModule | None) -> torch.fx.Node | None:
    """The FX node whose translation emitted ``onnx_node`` (names start with its name)."""
    if graph_module is None or not onnx_node.name:
        return None
    scope = onnx_node.name.split("/", 1)[0]
    described = onnx_node.metadata_props.get(METADATA_KEY)
    candidates = [
        node
        for module in graph_module.modules()
        if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
        if node.name == scope
    ]
    for node in candidates:
        if described is None or f"{node.op}:{node.target}" == described:
            return node
    return candidates[0] if candidates else None

