"""Module calls as model-local ONNX functions.

`ModuleFunctionTranslator` is the interpreter's `call_module_handler`: a `call_module`
node made by the Modularize pass is translated (`FxOnnxInterpreter.translate`) into the
body of an `ir.Function` whose inputs are the call's arguments (weights included), and the
call becomes one node in the caller's graph. Nested calls become functions that call
functions.

Names and domains are stable: the function of `encoder.layers.0.linear1`, a
`torch.nn.Linear`, is `torch_nn_modules_linear_Linear_encoder_layers_0_linear1` in domain
`pkg.torch.2.13.0` (the package of the module's class and its version).

Functions whose bodies are structurally identical (same ops, attributes, types, shapes and
wiring; names aside) share one definition: the first one made, called from every site.
A call whose FX graph has the `body_key` of a call translated before (the next layer of a
stack) reuses that translation without translating its graph again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import re
import sys
from typing import Any

import onnx_ir as ir
import torch
import torch.fx

from dispatcher.fx_nodes import placeholder_nodes
from fx2onnx.translate.body_key import body_key
from fx2onnx.translate.fake_metadata import OnnxTypeInfo, apply_type, onnx_type_of
from fx2onnx.translate.graph_builder import GraphBuilder
from fx2onnx.translate.interpreter import FAILED, BodyInput, FxOnnxInterpreter
from fx2onnx.fx_passes.modularize import MODULE_CALL_META, ModuleCall
from fx2onnx.progress import node_translated
from fx2onnx.translate.values import TracedValue

# Model-local function domains are versioned by their name; the import version is 1.
FUNCTION_DOMAIN_VERSION = 1


def package_domain(class_name: str) -> str:
    """`pkg.<package>.<version>` of the top-level package that defines a class.

    The local version label (`+cpu`, `+cu121`) is dropped, so that one model exports
    alike from every build of its package.
    """
    package = class_name.split(".", 1)[0]
    version = None
    module = sys.modules.get(package)
    if module is not None:
        version = getattr(module, "__version__", None)
    if version is None and package != "__main__":
        try:
            version = importlib.metadata.version(package)
        except (importlib.metadata.PackageNotFoundError, ValueError):
            version = None
    parts = ["pkg", package]
    if isinstance(version, str) and version:
        parts.append(version.split("+", 1)[0])
    return ".".join(parts)


def function_name(call: ModuleCall) -> str:
    """Class and attribute path: `torch_nn_modules_linear_Linear_encoder_layers_0_linear1`;
    repeated calls of one instance add `_call<N>`."""
    name = re.sub(r"\W", "_", f"{call.class_name}_{call.path}")
    return f"{name}_call{call.call_index}" if call.call_index else name


@dataclasses.dataclass(frozen=True)
class _Translation:
    """A module call translated: what every call with the same `body_key` reuses."""

    function: ir.Function | None  # None when nothing but constants comes out
    callees: tuple[ir.Function, ...]  # functions the body calls, defined before it
    results: tuple[Any, ...]  # the body's results: inner values or Python constants
    outputs: tuple[ir.Value, ...]  # the function's outputs, for the results that are values


class ModuleFunctionTranslator:
    """Translates `call_module` nodes into calls of model-local functions (one per export)."""

    def __init__(self, share_identical: bool = True, reuse_translations: bool = True) -> None:
        self.share_identical = share_identical
        # A call whose `body_key` was translated before reuses that translation
        # (only when identical bodies are shared: each call has its own function otherwise).
        self.reuse_translations = reuse_translations and share_identical
        self._by_body: dict[str, ir.Function] = {}
        self._by_key: dict[str, _Translation] = {}
        self._names: set[tuple[str, str]] = set()
        self.call_counts: dict[tuple[str, str], int] = {}

    def __call__(self, interpreter: FxOnnxInterpreter, node: torch.fx.Node, args: list[Any]) -> Any:
        assert interpreter.graph_module is not None
        sub_module = interpreter.graph_module.get_submodule(str(node.target))
        call: ModuleCall | None = getattr(sub_module, "meta", {}).get(MODULE_CALL_META)
        if not isinstance(sub_module, torch.fx.GraphModule) or call is None:
            raise TypeError(
                f"call_module '{node.target}' is not a module call made by the Modularize pass."
            )
        bindings, call_inputs = self._bind_parameters(interpreter, sub_module, args)
        key = body_key(sub_module, bindings, call.class_name) if self.reuse_translations else None
        translation = self._by_key.get(key) if key is not None else None
        if translation is not None:
            node_translated(sum(len(m.graph.nodes) for m in sub_module.modules() if isinstance(m, torch.fx.GraphModule)))
        else:
            recorded = interpreter.context.reported_count
            translation = self._translate(interpreter, sub_module, bindings, call)
            if translation is None:
                return FAILED  # the failing nodes inside were reported already
            # A translation that reported notes, warnings or errors is not reused: each call
            # reports its own (the level-none records of decisions are the same for all).
            if key is not None and interpreter.context.reported_count == recorded:
                self._by_key[key] = translation
        return self._call(interpreter, node, translation, call_inputs)

    def _translate(
        self, interpreter: FxOnnxInterpreter, sub_module: torch.fx.GraphModule, bindings: dict[str, Any], call: ModuleCall
    ) -> _Translation | None:
        """Translate the module's graph into a function body; None when a node failed."""
        body = GraphBuilder(
            name=function_name(call),
            opset_version=interpreter.builder.opset_version,
            on_inference_failure=interpreter.builder.on_inference_failure,
        )
        translated = interpreter.translate(sub_module, body, inputs=bindings)
        if translated.failed:
            return None
        results = tuple(translated.outputs)
        outputs = body.set_outputs([result for result in results if isinstance(result, ir.Value)])
        if not outputs:  # nothing but constants comes out: no call needed
            return _Translation(None, (), results, ())
        return _Translation(self._define(call, body), tuple(body.functions.values()), results, tuple(outputs))

    def _call(self, interpreter: FxOnnxInterpreter, node: torch.fx.Node, translation: _Translation, call_inputs: list[ir.Value]) -> Any:
        """The call of the translated function in the caller's graph; its results."""
        results, function, caller = translation.results, translation.function, interpreter.builder
        if function is None:
            return results[0] if len(results) == 1 else tuple(results)
        # Functions the body calls are defined before it, so definitions come callees first.
        for callee in translation.callees:
            caller.add_function(callee)
        caller.add_function(function, FUNCTION_DOMAIN_VERSION)
        identifier = (function.domain, function.name)
        self.call_counts[identifier] = self.call_counts.get(identifier, 0) + 1

        call_outputs = caller.add_node(function.domain, function.name, call_inputs, num_outputs=len(translation.outputs))
        metas = node.meta.get("val")
        metas = list(metas) if isinstance(metas, (tuple, list)) else [metas]
        returned: list[Any] = []
        made = iter(zip(call_outputs, translation.outputs))
        for result, meta in zip(results, metas):
            if not isinstance(result, ir.Value):
                returned.append(result)
                continue
            value, inner = next(made)
            _type_like(value, inner, onnx_type_of(meta, interpreter.namer))
            value.name = caller.unique_name(f"{node.name}_{len(returned)}" if len(results) > 1 else node.name)
            returned.append(value)
        return returned[0] if len(returned) == 1 else tuple(returned)

    # -- the body ----------------------------------------------------------------------------
    @staticmethod
    def _bind_parameters(
        interpreter: FxOnnxInterpreter, sub_module: torch.fx.GraphModule, args: list[Any]
    ) -> tuple[dict[str, Any], list[ir.Value]]:
        """Graph values become function inputs; Python constants are baked into the body.
        Returns the placeholder bindings and the values the call passes."""
        placeholders = placeholder_nodes(sub_module)
        bindings: dict[str, Any] = {}
        call_inputs: list[ir.Value] = []
        for placeholder, arg in zip(placeholders, args):
            if not isinstance(arg, ir.Value):
                bindings[placeholder.name] = arg
                continue
            info = onnx_type_of(placeholder.meta.get("val"), interpreter.namer)
            if info is None:
                info = OnnxTypeInfo(arg.dtype, arg.shape, getattr(arg, "is_complex", False))
            bindings[placeholder.name] = BodyInput(placeholder.name, info)
            call_inputs.append(arg)
        return bindings, call_inputs

    # -- definitions ------------------------------------------------------------------------------
    def _define(self, call: ModuleCall, body: GraphBuilder) -> ir.Function:
        """The function for this body: an identical one defined before, or a new one."""
        key = structural_key(body.graph) if self.share_identical else None
        function = self._by_body.get(key) if key is not None else None
        if function is None:
            domain = package_domain(call.class_name)
            name = self._unique_name(domain, function_name(call))
            body.graph.name = name
            function = ir.Function(domain, name, "", graph=body.graph, attributes=[])
            if key is not None:
                self._by_body[key] = function
        return function

    def _unique_name(self, domain: str, base: str) -> str:
        name, suffix = base, 1
        while (domain, name) in self._names:
            suffix += 1
            name = f"{base}_{suffix}"
        self._names.add((domain, name))
        return name


def _type_like(value: ir.Value, inner: ir.Value, info: Any) -> None:
    """A call output has the type of the module's result in PyTorch (or of the function's
    output when the metadata says nothing)."""
    if info is not None:
        apply_type(value, info)
        return
    value.dtype, value.shape = inner.dtype, inner.shape
    if isinstance(value, TracedValue):
        value.is_complex = getattr(inner, "is_complex", False)


# -- structural identity --------------------------------------------------------------------------
def structural_key(graph: ir.Graph) -> str:
    """A digest of what a function body computes, independent of value and node names:
    ops and their domains, attributes (subgraphs of If/Loop/Scan included, with their
    references to enclosing values), the wiring between nodes, and every value's type
    and shape. Equal keys mean the bodies are interchangeable."""
    parts = _graph_parts(graph, {}, "")
    parts.append("opsets " + repr(sorted(graph.opset_imports.items())))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _graph_parts(graph: ir.Graph, ids: dict[int, str], prefix: str) -> list[str]:
    """The structure of ``graph``; ``ids`` names the values of enclosing graphs, which
    a subgraph may read, by position (``prefix`` keeps nested positions apart)."""
    parts: list[str] = []
    for index, value in enumerate(graph.inputs):
        ids[id(value)] = f"{prefix}i{index}"
        parts.append(f"in {index} {_type_text(value)}")
    for index, node in enumerate(graph):
        inputs = ",".join("" if v is None else ids.get(id(v), f"?{v.name}") for v in node.inputs)
        attributes = ";".join(
            f"{name}={_attribute_text(attr, ids, f'{prefix}n{index}.{name}.')}"
            for name, attr in sorted(node.attributes.items())
        )
        outputs = []
        for position, value in enumerate(node.outputs):
            ids[id(value)] = f"{prefix}n{index}.{position}"
            outputs.append(_type_text(value))
        parts.append(f"{node.domain}::{node.op_type}:{node.overload}({inputs})[{attributes}]->{'|'.join(outputs)}")
    parts.append("out " + ",".join(ids.get(id(v), f"?{v.name}") for v in graph.outputs))
    return parts


def _type_text(value: ir.Value) -> str:
    shape = None if value.shape is None else [str(d) for d in value.shape]
    return f"{value.dtype}{shape}{'c' if getattr(value, 'is_complex', False) else ''}"


def _attribute_text(attr: ir.Attr, ids: dict[int, str], prefix: str) -> str:
    if attr.is_ref():
        return f"ref:{attr.ref_attr_name}"
    value = attr.value
    if attr.type == ir.AttributeType.TENSOR:
        return f"T{value.dtype}{list(value.shape)}:{hashlib.sha256(value.tobytes()).hexdigest()}"
    if attr.type == ir.AttributeType.TENSORS:
        return "Ts" + ",".join(f"{t.dtype}{list(t.shape)}:{hashlib.sha256(t.tobytes()).hexdigest()}" for t in value)
    if attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
        graphs = value if isinstance(value, (list, tuple)) else [value]
        return "G" + ",".join(
            "{" + "\n".join(_graph_parts(g, ids, f"{prefix}{k}.")) + "}" for k, g in enumerate(graphs)
        )
    return f"{attr.type.name}:{value!r}"
