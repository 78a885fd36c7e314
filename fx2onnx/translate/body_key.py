"""What decides the translation of a module call's FX graph, as one key.

Repeated layers of a network (24 encoder layers, 12 GPT-2 blocks) are module calls whose
graphs differ only in node names and in which weights they are given. Their ONNX bodies
come out the same, and `ModuleFunctionTranslator` shares one function among them. With
this key it can tell so before translating: a call whose key was translated before reuses
that translation, instead of translating the graph again to find the same body.

The key holds everything the translation reads (see `FxOnnxInterpreter`): every node's
opcode, target and arguments (other nodes by position), its ``meta["val"]`` type (dtype,
shape with its symbols, Python values as they are), how each placeholder is bound, and the
classes and keys of nested module calls. Graphs the key cannot describe safely (control-flow
subgraphs, constant tensors read by ``get_attr``, arguments of unknown types) get no key:
they are translated every time.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx

from dispatcher import NodeRoute, node_route
from fx2onnx.fx_passes.modularize import MODULE_CALL_META
from fx2onnx.translate.translated_body import BodyInput

# Python values that the key writes as their repr: equal reprs translate alike.
_PLAIN_TYPES = (type(None), bool, int, float, complex, str, type(Ellipsis), torch.dtype, torch.device, torch.layout, torch.memory_format)


class _NoKey(Exception):
    """The graph holds something the key cannot describe."""


def body_key(graph_module: torch.fx.GraphModule, bindings: Mapping[str, Any], class_name: str) -> str | None:
    """The key of translating ``graph_module``, the graph of a module of class
    ``class_name`` (which decides the function's domain), with its placeholders bound by
    ``bindings`` (as `FxOnnxInterpreter.translate` takes them); None when the graph
    cannot be keyed."""
    try:
        lines = [class_name, *(_binding_text(node, bindings) for node in graph_module.graph.find_nodes(op="placeholder"))]
        lines += _graph_lines(graph_module)
    except _NoKey:
        return None
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _binding_text(placeholder: torch.fx.Node, bindings: Mapping[str, Any]) -> str:
    binding = bindings.get(placeholder.name, BodyInput())
    if isinstance(binding, BodyInput):
        info = binding.info
        return "input" if info is None else f"input {info.dtype} {list(info.shape)} {info.is_complex}"
    return f"constant {_argument_text(binding, {})}"


def _graph_lines(graph_module: torch.fx.GraphModule) -> list[str]:
    positions: dict[torch.fx.Node, int] = {}
    lines = []
    for position, node in enumerate(graph_module.graph.nodes):
        positions[node] = position
        if node.op == "get_attr":
            raise _NoKey  # constant tensors and subgraphs: their contents are not keyed
        if node.op == "call_function" and node_route(node.target) is NodeRoute.HIGHER_ORDER:
            raise _NoKey
        target = node.target
        if node.op in ("placeholder", "output"):
            target = ""  # a placeholder's target is its name: names are not keyed
        elif node.op == "call_module":
            nested = graph_module.get_submodule(str(target))
            if not isinstance(nested, torch.fx.GraphModule):
                raise _NoKey
            call = getattr(nested, "meta", {}).get(MODULE_CALL_META)
            target = "{" + "\n".join([repr(getattr(call, "class_name", None)), *_graph_lines(nested)]) + "}"
        elif node.op == "call_function":
            target = repr(target)
        arguments = _argument_text((node.args, node.kwargs), positions)
        lines.append(f"{node.op} {target} {arguments} -> {_meta_text(node.meta.get('val'))}")
    return lines


def _argument_text(argument: Any, positions: Mapping[torch.fx.Node, int]) -> str:
    if isinstance(argument, torch.fx.Node):
        if argument not in positions:
            raise _NoKey
        return f"%{positions[argument]}"
    if isinstance(argument, (list, tuple)):
        return type(argument).__name__ + "(" + ",".join(_argument_text(item, positions) for item in argument) + ")"
    if isinstance(argument, dict):
        return "{" + ",".join(f"{key!r}:{_argument_text(value, positions)}" for key, value in argument.items()) + "}"
    return _plain_text(argument)


def _plain_text(value: Any) -> str:
    if not isinstance(value, _PLAIN_TYPES):
        raise _NoKey
    return f"{type(value).__name__}:{value!r}"


def _meta_text(value: Any) -> str:
    """The type of a node's result as the translation reads it: dtype and shape (with
    its symbolic sizes) of a tensor, the expression of a symbolic scalar, a Python value."""
    if isinstance(value, torch.Tensor):
        return f"T{value.dtype}[{','.join(_size_text(size) for size in value.shape)}]"
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return f"{type(value).__name__}:{_expression_text(value.node.expr)}"
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_meta_text(item) for item in value) + ")"
    return _plain_text(value)


def _size_text(size: Any) -> str:
    return _expression_text(size.node.expr) if isinstance(size, torch.SymInt) else str(size)


@functools.lru_cache(maxsize=4096)
def _expression_text(expression: Any) -> str:
    # Printing a symbolic size is slow (sympy's printer) and the same sizes recur in
    # every layer and at every level of nested module calls: print each once.
    return str(expression)
