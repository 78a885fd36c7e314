"""Module functions inlined, the module structure kept in node names and metadata.

OpenVINO and TVM take no model-local functions. onnx_ir's `InlinePass` inlines them,
but names each inlined node after the node of the function body alone (``conv2d/Conv_0``
for every convolution). Before it runs, each call gets its own copy of its function,
whose nodes are named after the call's place (``layer1.0/conv1/conv2d/Conv_0``) and carry
the module's path in the metadata key ``pkg.fx2onnx.module``, as a flat export's nodes
do (`fx2onnx.translate.module_scope`). The copy is then optimized again: constants fold
across the former function boundaries and batch normalization joins the convolution
before it.
"""

from __future__ import annotations

import onnx_ir as ir

from fx2onnx.onnx_passes.batch_norm_folding import fold_batch_norms
from fx2onnx.onnx_passes.optimization import optimize_keeping_functions
from fx2onnx.translate.module_scope import MODULE_KEY


def inlined_model(model: ir.Model, *, fold_batch_norm: bool = True) -> ir.Model:
    """A copy of ``model`` without model-local functions (the weights are shared, not
    copied), optimized again; ``fold_batch_norm`` folds batch normalization into the
    layer before it where the weights have data."""
    copy = model.clone()
    if copy.functions:
        _one_function_per_call(copy)
        ir.passes.common.InlinePass()(copy)
        optimize_keeping_functions(copy)
    if fold_batch_norm:
        fold_batch_norms(copy)
    return copy


def _scope(call: ir.Node) -> str:
    """The place of a call in its graph: its name without the final node part."""
    return (call.name or "").rpartition("/")[0]


def _one_function_per_call(model: ir.Model) -> None:
    """Give every call of a model-local function its own copy of it, with the nodes named
    after the call's place; the shared definitions are left for `InlinePass` to drop."""
    originals = dict(model.functions)
    # (graph, the prefix of its nodes' names, its module path); a call's own place is read
    # from its name as the function body had it
    pending: list[tuple[ir.Graph, str, str]] = [(model.graph, "", "")]
    places: dict[ir.Node, str] = {node: _scope(node) for node in model.graph}
    count = 0
    while pending:
        graph, name_prefix, module_path = pending.pop()
        for node in graph:
            function = originals.get(node.op_identifier())
            if function is None:
                continue
            place = places[node]
            prefix = f"{name_prefix}{place}/" if place else name_prefix
            path = ".".join(part for part in (module_path, place) if part)
            copy = function.clone()
            copy.overload = f"{function.overload}call{count}"
            count += 1
            for inner in copy:
                places[inner] = _scope(inner)
                inner.name = f"{prefix}{inner.name}" if inner.name else inner.name
                if path:
                    inner.metadata_props.setdefault(MODULE_KEY, path)
            model.functions[copy.identifier()] = copy
            node.overload = copy.overload
            pending.append((copy.graph, prefix, path))
