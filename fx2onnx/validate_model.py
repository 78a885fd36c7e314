"""Validation before success: the final model passes ONNX's checker and strict inference.

An export that would hand back a model ONNX Runtime refuses fails instead, with an error
diagnostic naming the ONNX node, its op and the user's source line of the FX node that
made it. Weights are left out of the checked copy (large initializers become typed graph
inputs), so the check costs about as much for a 7B model as for a small one.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import onnx
import onnx_ir as ir
import torch

from diagnostics import DiagnosticContext, Level, rules
from dispatcher import node_location, node_stack
from fx2onnx.legalize_types import METADATA_KEY

# Initializers with more elements than this are checked by type and shape only.
_INLINE_ELEMENTS = 1024

_NODE_NAME = re.compile(r"node name: ([^)\n]*)\)|name: (\S+) OpType: (\S+)")


def weightless_proto(model: ir.Model) -> onnx.ModelProto:
    """The model as a proto whose large initializers are typed graph inputs instead."""
    # Weights without data (fake-mode exports) are checked by type and shape too.
    large = [
        value
        for value in model.graph.initializers.values()
        if value.const_value is None or _elements(value.const_value) > _INLINE_ELEMENTS
    ]
    saved = [(value, value.const_value) for value in large]
    serde_logger = logging.getLogger(ir.serde.__name__)
    level = serde_logger.level
    try:
        for value, _ in saved:
            value.const_value = None  # serialize_model skips initializers without data
        serde_logger.setLevel(logging.ERROR)  # ... and warns about each: expected here
        proto = ir.serde.serialize_model(model)
    finally:
        serde_logger.setLevel(level)
        for value, tensor in saved:
            value.const_value = tensor
    names = {value.name for value in large}
    graph_inputs = {i.name for i in proto.graph.input}
    kept = []
    for info in proto.graph.value_info:
        if info.name in names and info.name not in graph_inputs:
            proto.graph.input.append(info)
        else:
            kept.append(info)
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(kept)
    return proto


def _elements(tensor: ir.TensorProtocol) -> int:
    size = 1
    for dim in tensor.shape:
        size *= int(dim)
    return size


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


def all_onnx_nodes(model: ir.Model) -> Iterator[ir.Node]:
    """Nodes of the main graph, its sub-graphs and every function body."""
    yield from model.graph.all_nodes()
    for function in model.functions.values():
        yield from function.all_nodes()


def _find_node(model: ir.Model, name: str) -> ir.Node | None:
    return next((node for node in all_onnx_nodes(model) if node.name == name), None)


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

