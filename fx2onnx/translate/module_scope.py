"""The module a node of a flat graph comes from, in its ONNX name and metadata.

Without module functions the graph is flat; its nodes still tell which module call made
them, so that tools (Netron, profilers, onnxruntime's node names in errors) can group
them: the module's attribute path starts the node's name (``layer1.0.conv1/convolution/Conv_3``)
and is in the metadata key ``pkg.fx2onnx.module``, its class in ``pkg.fx2onnx.module_class``.
A call of a module function carries, in the same key, the module's path relative to its
caller, from which `fx2onnx.onnx_passes.inlining` names the nodes it inlines.
"""

from __future__ import annotations

import torch.fx

from fx2onnx.fx_passes.modularize import MODULE_PATH_META, module_stack

MODULE_KEY = "pkg.fx2onnx.module"
MODULE_CLASS_KEY = "pkg.fx2onnx.module_class"


def flat_node_scope(node: torch.fx.Node) -> tuple[str, dict[str, str]]:
    """The scope of ``node``'s ONNX nodes (its module's path, then its own name) and the
    metadata naming its module; the node's name alone at the model's top level."""
    calls = module_stack(node)
    if not calls:
        return node.name, {}
    innermost = calls[-1]
    return f"{innermost.path}/{node.name}", {MODULE_KEY: innermost.path, MODULE_CLASS_KEY: innermost.class_name}


def fx_node_name(node_name: str, module_path: str | None) -> str:
    """The FX node an ONNX node of a flat graph was emitted for, from the node's name
    (`flat_node_scope`'s scope, then the operator) and its ``pkg.fx2onnx.module`` path."""
    if module_path and node_name.startswith(module_path + "/"):
        node_name = node_name[len(module_path) + 1:]
    return node_name.split("/", 1)[0]


def call_metadata(node: torch.fx.Node) -> dict[str, str]:
    """The metadata naming the module a `call_module` node calls (its path relative to the
    caller), when the node is a module function's call."""
    path = node.meta.get(MODULE_PATH_META) if node.op == "call_module" else None
    return {MODULE_KEY: path} if path else {}
