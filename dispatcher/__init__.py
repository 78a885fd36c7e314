"""Which ONNX function implements an FX node.

The registry of ONNX Script functions per PyTorch operator overload (torchlib's plus
the user's) and the dispatcher that picks one for a node by matching signatures.

>>> from dispatcher import OnnxRegistry, qualified_name_of
>>> import torch
>>> qualified_name_of(torch.ops.aten.add.Tensor)
'aten::add.Tensor'
"""

from dispatcher.decision import Candidate, DispatchDecision, Refusal, decide
from dispatcher.fx_nodes import (
    argument_value,
    graph_modules,
    is_tool_frame,
    node_location,
    node_stack,
    node_value,
    node_values,
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
    "Refusal",
    "argument_value",
    "decide",
    "graph_modules",
    "node_value",
    "node_values",
    "DROPPED_KWARGS",
    "DispatchError",
    "NodeRoute",
    "OnnxFunctionDispatcher",
    "OnnxRegistry",
    "OnnxScriptFunction",
    "OpName",
    "ParameterCheck",
    "RegisteredFunction",
    "record_identity_removed",
    "SignatureMatch",
    "is_tool_frame",
    "match_signature",
    "node_location",
    "node_route",
    "node_stack",
    "normalize_qualified_name",
    "optional_parameters",
    "schema_defaults",
    "is_tuple_constructor",
    "qualified_name_of",
    "stack_location",
    "torch_dtype_to_onnx",
    "walk_graph_modules",
]
