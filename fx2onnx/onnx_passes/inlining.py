"""Module functions inlined, the module structure kept in node names and metadata.

OpenVINO and TVM take no model-local functions. onnx_ir's `InlinePass` inlines them,
but names each inlined node after the node of the function body alone (``conv2d/Conv_0``
for every convolution). Before it runs, each call gets its own copy of its function,
whose nodes are named after the module's path (``layer1.0.conv1/conv2d/Conv_0``) and
carry it in the metadata key ``pkg.fx2onnx.module``, as a flat export's nodes do
(`fx2onnx.translate.module_scope`). The copy is then optimized again: constants fold
across the former function boundaries, batch normalization joins the convolution
before it, and constants are kept as initializers, as in the portable target.
"""

from __future__ import annotations

import onnx_ir as ir

from fx2onnx.onnx_passes.batch_norm_folding import fold_batch_norms
from fx2onnx.onnx_passes.optimization import optimize_keeping_functions
from fx2onnx.onnx_passes.weight_folding import constants_as_initializers, fold_weight_reads
from fx2onnx.translate.module_scope import MODULE_KEY


def inlined_model(model: ir.Model, *, fold_weights: bool = True) -> ir.Model:
    """A copy of ``model`` without model-local functions (the weights are shared, not
    copied), optimized again, its constants as initializers; ``fold_weights`` folds batch
    normalization into the layer before it and the nodes that read only weights, where
    the weights have data (as the portable target does)."""
    copy = model.clone()
    if copy.functions:
        _one_function_per_call(copy)
        ir.passes.common.InlinePass()(copy)
        optimize_keeping_functions(copy)
    if fold_weights:
        fold_batch_norms(copy)
        fold_weight_reads(copy)
    constants_as_initializers(copy)
    return copy


def _one_function_per_call(model: ir.Model) -> None:
    """Give every call of a model-local function its own copy of it, whose nodes are named
    after the module's path (``layer1.0.conv1/conv2d/Conv_0``) and carry it in their
    metadata; the shared definitions are left for `InlinePass` to drop."""
    originals = dict(model.functions)
    pending: list[tuple[ir.Graph, str]] = [(model.graph, "")]  # a graph, its module path
    count = 0
    while pending:
        graph, module_path = pending.pop()
        for node in graph:
            function = originals.get(node.op_identifier())
            if function is None:
                continue
            # the call names its module relative to the caller (older files: its scope)
            place = node.metadata_props.get(MODULE_KEY) or (node.name or "").rpartition("/")[0]
            path = ".".join(part for part in (module_path, place) if part)
            copy = function.clone()
            copy.overload = f"{function.overload}call{count}"
            count += 1
            for inner in copy:
                if inner.op_identifier() not in originals:
                    inner.name = f"{path}/{inner.name}" if path and inner.name else inner.name
                    inner.metadata_props.setdefault(MODULE_KEY, path)
            model.functions[copy.identifier()] = copy
            node.overload = copy.overload
            pending.append((copy.graph, path))
