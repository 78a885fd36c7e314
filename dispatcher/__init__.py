"""Which ONNX function implements an FX node.

The registry of ONNX Script functions per PyTorch operator overload (torchlib's plus
the user's), the decision that picks one for a node by matching signatures
(`decision.decide`), the dispatcher that reports it, and the FX-graph helpers every layer
above uses (`fx_nodes`).

>>> from dispatcher import OnnxRegistry, qualified_name_of
>>> import torch
>>> qualified_name_of(torch.ops.aten.add.Tensor)
'aten::add.Tensor'
"""

from dispatcher.decision import Candidate, DispatchDecision, Refusal, decide
from dispatcher.fx_nodes import (
    argument_value,
    fetch_attr,
    graph_modules,
    is_tool_frame,
    node_location,
    node_stack,
    node_value,
    node_values,
    placeholder_nodes,
    stack_location,
    walk_graph_modules,
)
from dispatcher._matching import DROPPED_KWARGS, ParameterCheck, SignatureMatch, match_signature, optional_parameters, schema_defaults
from dispatcher._names import OpName, normalize_qualified_name, qualified_name_of
from dispatcher._types import torch_dtype_to_onnx
from dispatcher.dispatcher import (
    DispatchError,
    NodeRoute,
    OnnxFunctionDispatcher,
    is_tuple_constructor,
    node_route,
    record_identity_removed,
)
from dispatcher.registry import OnnxRegistry, OnnxScriptFunction, RegisteredFunction

__all__ = [
    "Candidate",
    "DispatchDecision",
    "DispatchError",
    "DROPPED_KWARGS",
    "NodeRoute",
    "OnnxFunctionDispatcher",
    "OnnxRegistry",
    "OnnxScriptFunction",
    "OpName",
    "ParameterCheck",
    "Refusal",
    "RegisteredFunction",
    "SignatureMatch",
    "argument_value",
    "decide",
    "fetch_attr",
    "graph_modules",
    "is_tool_frame",
    "is_tuple_constructor",
    "match_signature",
    "node_location",
    "node_route",
    "node_stack",
    "node_value",
    "node_values",
    "normalize_qualified_name",
    "optional_parameters",
    "placeholder_nodes",
    "qualified_name_of",
    "record_identity_removed",
    "schema_defaults",
    "stack_location",
    "torch_dtype_to_onnx",
    "walk_graph_modules",
]
