"""Modularize: group FX nodes by the `nn.Module` call they came from into nested
GraphModules, each called by a `call_module` node.

torch.export records on every node `meta["nn_module_stack"]`, an ordered mapping from a
stack key (`'L__self__encoder.layers.0'`, with `'@N'` appended for the N-th repeated call
of one instance) to `(attribute path, class qualified name)`. Nodes are read in graph order;
a module call is the run of consecutive nodes that share a key, so two calls of one instance
in a row stay two calls (their keys differ by `@N`). Each call becomes a sub-GraphModule
whose placeholders are the values it uses but does not make (parameters included: ONNX
functions have no initializers) and whose outputs are the values used after it. The
interpreter turns each `call_module` into a call of a model-local ONNX function. A call
that holds an onnxruntime kernel (`fused_kernels.operators.ONNXRUNTIME_KERNELS`) stays in
its caller's graph: ONNX's checker knows no types of that kernel's outputs inside a function.

This pass must run last: it moves nodes out of the root graph.
"""

from __future__ import annotations

import fnmatch
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import torch
import torch.fx

from dispatcher.fx_nodes import fetch_attr
from fx2onnx.fx_passes.fused_kernels.operators import ONNXRUNTIME_KERNELS
from fx2onnx.options import ModuleFunctionOptions

# Where the pass leaves what the interpreter needs to know about a sub-GraphModule.
MODULE_CALL_META = "fx2onnx_module_call"


@dataclass(frozen=True)
class ModuleCall:
    """One call of one module instance."""

    key: str  # the stack key, unique per call: 'L__self__encoder.layers.0@1'
    path: str  # attribute path of the instance: 'encoder.layers.0'
    class_name: str  # qualified class name: 'torch.nn.modules.linear.Linear'
    call_index: int  # N of the '@N' suffix; 0 for the first call

    @property
    def short_class_name(self) -> str:
        return self.class_name.rsplit(".", 1)[-1]


@dataclass
class _Scope:
    """A module call under construction: its FX nodes and nested calls, in graph order."""

    call: ModuleCall | None  # None for the root graph
    items: list[Union[torch.fx.Node, "_Scope"]] = field(default_factory=list)

    def scopes(self) -> list[_Scope]:
        return [item for item in self.items if isinstance(item, _Scope)]

    def nodes(self) -> list[torch.fx.Node]:
        """Every FX node of this call and of the calls nested in it."""
        found: list[torch.fx.Node] = []
        for item in self.items:
            if isinstance(item, _Scope):
                found.extend(item.nodes())
            else:
                found.append(item)
        return found


# the meta key of a call_module node: the module's attribute path relative to its caller
# ("0" inside a Sequential, "layer1" at the model's top), which its target, a Python
# name, may not spell
MODULE_PATH_META = "fx2onnx_module_path"


# -- reading nn_module_stack --------------------------------------------------------------
_CALL_SUFFIX = re.compile(r"@(\d+)$")


def _class_name(cls: Any) -> str:
    if isinstance(cls, type):
        return f"{cls.__module__}.{cls.__qualname__}"
    return str(cls)


def _attribute_path(path: str) -> str:
    # dynamo writes "L['self'].encoder.layers.0"; torch.export writes "encoder.layers.0"
    for prefix in ("L['self']", "L__self__"):
        if path.startswith(prefix):
            path = path[len(prefix):].lstrip(".")
    return path


# torch.export's mark for a node one of its own passes made (a sym_size read inside a
# module): the node has no stack of its own, it is not a module call.
_NO_STACK_KEY = "_empty_nn_module_stack_from_metadata_hook"


def module_stack(node: torch.fx.Node) -> list[ModuleCall] | None:
    """The module calls a node belongs to, outermost first, without the root model.
    None when the node carries no stack."""
    raw = node.meta.get("nn_module_stack")
    if raw is None or _NO_STACK_KEY in raw:
        return None
    stack: list[ModuleCall] = []
    for key, value in raw.items():
        path, cls = value if isinstance(value, tuple) else (key, value)
        path = _attribute_path(str(path))
        if not path:  # the exported model itself is the graph, not a call in it
            continue
        match = _CALL_SUFFIX.search(str(key))
        stack.append(ModuleCall(str(key), path, _class_name(cls), int(match.group(1)) if match else 0))
    return stack


def _common_prefix(a: list[ModuleCall], b: list[ModuleCall]) -> list[ModuleCall]:
    prefix = []
    for x, y in zip(a, b):
        if x.key != y.key:
            break
        prefix.append(x)
    return prefix


def _node_stacks(graph: torch.fx.Graph) -> dict[torch.fx.Node, list[ModuleCall]]:
    """The stack of every computing node. Nodes that carry none (made by a pass) get the
    calls their neighbours share, so they never split a call in two."""
    nodes = [n for n in graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    stacks: dict[torch.fx.Node, list[ModuleCall] | None] = {n: module_stack(n) for n in nodes}
    known = [i for i, n in enumerate(nodes) if stacks[n] is not None]
    result: dict[torch.fx.Node, list[ModuleCall]] = {}
    position = 0
    for index, node in enumerate(nodes):
        stack = stacks[node]
        if stack is None:
            while position < len(known) and known[position] < index:
                position += 1
            before = stacks[nodes[known[position - 1]]] if position > 0 else []
            after = stacks[nodes[known[position]]] if position < len(known) else []
            stack = _common_prefix(before or [], after or [])
        # An element of a tuple is taken where the tuple was made: tuples never cross calls.
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            source = node.args[0]
            if source in result and isinstance(source.meta.get("val"), (tuple, list)):
                stack = result[source]
        result[node] = stack
    return result


# -- choosing calls ---------------------------------------------------------------------------
def _matches(pattern: str | type, call: ModuleCall) -> bool:
    if isinstance(pattern, type):
        return _class_name(pattern) == call.class_name
    return any(
        fnmatch.fnmatchcase(name, pattern)
        for name in (call.class_name, call.short_class_name, call.path)
    )


def _is_selected(scope: _Scope, options: ModuleFunctionOptions) -> bool:
    call = scope.call
    assert call is not None
    if options.include is not None and not any(_matches(p, call) for p in options.include):
        return False
    if any(_matches(p, call) for p in options.exclude):
        return False
    if not options.torch_nn_leaves and call.class_name.startswith("torch.nn.") and not scope.scopes():
        return False
    return not any(node.target in ONNXRUNTIME_KERNELS for node in scope.nodes())


def _keep_selected(scope: _Scope, options: ModuleFunctionOptions) -> None:
    """Calls that are not chosen are dissolved into their caller (children first, so a
    leaf is judged after its own children were dissolved)."""
    items: list[torch.fx.Node | _Scope] = []
    for item in scope.items:
        if isinstance(item, _Scope):
            _keep_selected(item, options)
            if _is_selected(item, options):
                items.append(item)
            else:
                items.extend(item.items)
        else:
            items.append(item)
    scope.items = items


# -- grouping ---------------------------------------------------------------------------------
def _group(graph: torch.fx.Graph, stacks: Mapping[torch.fx.Node, list[ModuleCall]]) -> _Scope:
    root = _Scope(None)
    open_scopes: list[_Scope] = []  # the calls the previous node was in, outermost first
    for node in graph.nodes:
        stack = stacks.get(node)
        if stack is None:  # placeholders, get_attr, output: the root graph keeps them
            continue
        depth = 0
        while depth < min(len(open_scopes), len(stack)) and open_scopes[depth].call.key == stack[depth].key:  # type: ignore[union-attr]
            depth += 1
        del open_scopes[depth:]
        for call in stack[depth:]:
            scope = _Scope(call)
            (open_scopes[-1] if open_scopes else root).items.append(scope)
            open_scopes.append(scope)
        (open_scopes[-1] if open_scopes else root).items.append(node)
    return root


# -- building GraphModules ------------------------------------------------------------------------
def lazy_graph_module(root: Any, graph: torch.fx.Graph, class_name: str) -> torch.fx.GraphModule:
    """A GraphModule whose Python code is generated only when it is asked for.

    The interpreter reads the graphs of module calls, never runs them: generating and
    compiling the code of each (what a GraphModule does when built) is most of this
    pass's time. torch.fx's lazy GraphModule (private) does it on first use instead.
    """
    from torch.fx._lazy_graph_module import _LazyGraphModule

    return _LazyGraphModule(root, graph, class_name=class_name)


class _Builder:
    def __init__(self, graph_module: torch.fx.GraphModule, parameter_names: Mapping[str, str]) -> None:
        self.original = graph_module
        self.parameter_names = parameter_names
        self.order = {node: index for index, node in enumerate(graph_module.graph.nodes)}

    def build_root(self, root: _Scope) -> torch.fx.GraphModule:
        graph = torch.fx.Graph()
        env: dict[torch.fx.Node, torch.fx.Node] = {}
        attributes: dict[str, Any] = {}
        # Inputs and weights first: they have no inputs and every call may use them.
        for node in self.original.graph.nodes:
            if node.op in ("placeholder", "get_attr"):
                env[node] = graph.node_copy(node, lambda n: env[n])
                if node.op == "get_attr":
                    attributes[str(node.target)] = fetch_attr(self.original, str(node.target))
        self._emit_items(root, graph, env, attributes, "")
        output = next(n for n in reversed(self.original.graph.nodes) if n.op == "output")
        graph.node_copy(output, lambda n: env[n])
        result = lazy_graph_module(attributes, graph, type(self.original).__name__)
        result.meta.update(getattr(self.original, "meta", {}))
        return result

    def _emit_items(
        self,
        scope: _Scope,
        graph: torch.fx.Graph,
        env: dict[torch.fx.Node, torch.fx.Node],
        attributes: dict[str, Any],
        path: str,
    ) -> None:
        for item in scope.items:
            if isinstance(item, _Scope):
                self._emit_call(item, graph, env, attributes, path)
            else:
                env[item] = graph.node_copy(item, lambda n: env[n])

    def _emit_call(
        self,
        scope: _Scope,
        graph: torch.fx.Graph,
        env: dict[torch.fx.Node, torch.fx.Node],
        attributes: dict[str, Any],
        caller_path: str,
    ) -> None:
        """Build the call's GraphModule and replace its nodes by one call_module node."""
        call = scope.call
        assert call is not None
        inner_nodes = scope.nodes()
        inside = set(inner_nodes)
        inputs = _inputs_in_first_use_order(inner_nodes, inside)
        outputs = [n for n in inner_nodes if any(user not in inside for user in n.users)]
        if not outputs:  # nothing of the call is used: no function, its nodes stay inline
            self._emit_items(scope, graph, env, attributes, caller_path)
            return

        sub_graph = torch.fx.Graph()
        sub_env: dict[torch.fx.Node, torch.fx.Node] = {}
        sub_attributes: dict[str, Any] = {}
        for node in inputs:
            placeholder = sub_graph.placeholder(self._input_name(node, call.path))
            placeholder.meta = {k: v for k, v in node.meta.items() if k in ("val", "tensor_meta")}
            sub_env[node] = placeholder
        self._emit_items(scope, sub_graph, sub_env, sub_attributes, call.path)
        results = [sub_env[n] for n in outputs]
        sub_graph.output(results[0] if len(results) == 1 else tuple(results))
        sub_module = lazy_graph_module(sub_attributes, sub_graph, call.class_name.replace(".", "_"))
        sub_module.meta[MODULE_CALL_META] = call

        target = _unique_attribute(attributes, _python_name(_relative(call.path, caller_path)) + (f"_call{call.call_index}" if call.call_index else ""))
        attributes[target] = sub_module
        first = inner_nodes[0]
        call_node = graph.call_module(target, tuple(env[n] for n in inputs))
        call_node.meta["nn_module_stack"] = _callers_stack(first, call)
        call_node.meta[MODULE_PATH_META] = _relative(call.path, caller_path)
        trace = next((n.meta["stack_trace"] for n in inner_nodes if n.meta.get("stack_trace")), None)
        if trace is not None:
            call_node.meta["stack_trace"] = trace
        if len(outputs) == 1:
            call_node.meta["val"] = outputs[0].meta.get("val")
            env[outputs[0]] = call_node
            return
        call_node.meta["val"] = tuple(n.meta.get("val") for n in outputs)
        for index, node in enumerate(outputs):
            element = graph.call_function(operator.getitem, (call_node, index))
            element.meta["val"] = node.meta.get("val")
            element.meta["nn_module_stack"] = call_node.meta["nn_module_stack"]
            env[node] = element

    def _input_name(self, node: torch.fx.Node, path: str) -> str:
        """Weights are named after their place in the module (`linear1.weight` inside
        `encoder.layers.0`), so that every instance names its inputs alike."""
        name = self.parameter_names.get(node.name)
        if name is not None and path and name.startswith(path + "."):
            return _python_name(name[len(path) + 1:])
        return node.name


def _callers_stack(node: torch.fx.Node, call: ModuleCall) -> dict[str, Any]:
    """The stack entries of a node inside `call` that are outside it: the call's own stack."""
    outer: dict[str, Any] = {}
    for key, value in (node.meta.get("nn_module_stack") or {}).items():
        if key == call.key:
            break
        outer[key] = value
    return outer


def _inputs_in_first_use_order(nodes: list[torch.fx.Node], inside: set[torch.fx.Node]) -> list[torch.fx.Node]:
    inputs: dict[torch.fx.Node, None] = {}
    for node in nodes:
        for used in node.all_input_nodes:
            if used not in inside:
                inputs.setdefault(used)
    return list(inputs)


def _relative(path: str, caller_path: str) -> str:
    if caller_path and path.startswith(caller_path + "."):
        return path[len(caller_path) + 1:]
    return path


def _python_name(text: str) -> str:
    name = re.sub(r"\W", "_", text)
    return name if name and not name[0].isdigit() else f"m_{name}"


def _unique_attribute(attributes: Mapping[str, Any], base: str) -> str:
    name, suffix = base, 1
    while name in attributes:
        name = f"{base}_{suffix}"
        suffix += 1
    return name


def modularize(
    graph_module: torch.fx.GraphModule,
    options: ModuleFunctionOptions,
    parameter_names: Mapping[str, str] | None = None,
) -> torch.fx.GraphModule:
    """Return a graph module in which every chosen module call is a `call_module` node.

    Args:
        graph_module: an aten-level graph from torch.export, with `nn_module_stack` meta.
        options: which calls become functions.
        parameter_names: placeholder name -> parameter/buffer name, for readable input
            names inside the calls.

    The input graph module is left as it is. Without any chosen call, it is returned as is.
    """
    stacks = _node_stacks(graph_module.graph)
    root = _group(graph_module.graph, stacks)
    _keep_selected(root, options)
    if not root.scopes():
        return graph_module
    return _Builder(graph_module, parameter_names or {}).build_root(root)


def unmatched_patterns(graph_module: torch.fx.GraphModule, options: ModuleFunctionOptions) -> list[tuple[str, str | type, list[str]]]:
    """The include and exclude patterns that match no module call of the graph, as
    (option name, pattern, the short class names of the calls there are)."""
    calls = {call.key: call for stack in _node_stacks(graph_module.graph).values() for call in stack}.values()
    classes = sorted({call.short_class_name for call in calls})
    return [
        (option, pattern, classes)
        for option, patterns in (("include", options.include or ()), ("exclude", options.exclude))
        for pattern in patterns
        if not any(_matches(pattern, call) for call in calls)
    ]


def module_calls(graph_module: torch.fx.GraphModule) -> list[tuple[str, ModuleCall]]:
    """The call_module nodes of a graph module with their calls, for inspection and tests."""
    found = []
    for node in graph_module.graph.nodes:
        if node.op == "call_module":
            sub = graph_module.get_submodule(str(node.target))
            found.append((str(node.target), sub.meta.get(MODULE_CALL_META)))
    return found
