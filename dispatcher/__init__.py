"""Which ONNX function implements an FX node.

The registry of ONNX Script functions per PyTorch operator overload (torchlib's plus
the user's) and the dispatcher that picks one for a node by matching signatures.

>>> from dispatcher import OnnxRegistry, qualified_name_of
>>> import torch
>>> qualified_name_of(torch.ops.aten.add.Tensor)
'aten::add.Tensor'
"""

from dispatcher._locations import is_tool_frame, node_location, node_stack, stack_location
from dispatcher._matching import DROPPED_KWARGS, ParameterCheck, SignatureMatch, match_signature, optional_parameters, schema_defaults
from dispatcher._names import OpName, normalize_qualified_name, qualified_name_of
from dispatcher._types import torch_dtype_to_onnx
from dispatcher.dispatcher import (
    DispatchError,
    NodeRoute,
    OnnxFunctionDispatcher,
    WrongKindOfFunction,
    is_tuple_constructor,
    node_route,
    record_identity_removed,
    walk_graph_modules,
)
from dispatcher.registry import OnnxRegistry, OnnxScriptFunction, RegisteredFunction

__all__ = [
    "DROPPED_KWARGS",
    "DispatchError",
    "NodeRoute",
    "OnnxFunctionDispatcher",
    "OnnxRegistry",
    "OnnxScriptFunction",
    "OpName",
    "ParameterCheck",
    "RegisteredFunction",
    "WrongKindOfFunction",
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
