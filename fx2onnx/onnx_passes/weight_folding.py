"""Nodes computable from the weights alone, folded (the portable target).

The optimizer leaves nodes that read weights (so that the weights keep their names for
`ONNXProgram.save(model_state=...)`). A portable file folds them as well: a runtime
without constant folding of its own (TVM's frontend, onnxruntime-web's WebGPU placement)
then computes nothing at every call that it could have known at export (rotary tables
from ``inv_freq``, ``Slice`` of ``position_ids``, embeddings of constant indices at static
shapes). The folded results keep onnxscript's limits on the size of what is folded (a
node whose output would exceed them stays); small ones become Constant nodes, larger
ones initializers marked as folded, which `save(model_state=...)` then refuses (a
checkpoint holds the weights they come from). A model with weights without data (fake
mode) is left as it is: the checkpoint gives its weights when it is written.
"""

from __future__ import annotations

import onnx_ir as ir

from fx2onnx.onnx_passes.batch_norm_folding import FOLDED_KEY
from fx2onnx.onnx_passes.fake_weights import fake_weights
from fx2onnx.onnx_passes.optimization import constants_back_to_nodes

_CONSTANT_NODE_LIMIT = 1024  # elements: a folded value up to this size is a Constant node


def fold_weight_reads(model: ir.Model) -> int:
    """Fold the main graph's nodes whose inputs are all weights or constants; returns how
    many nodes the graph lost."""
    from onnxscript.optimizer import fold_constants_ir

    graph = model.graph
    if fake_weights(model):
        return 0
    before, weights = len(graph), set(graph.initializers)
    fold_constants_ir(model, onnx_shape_inference=False)
    ir.passes.common.RemoveUnusedNodesPass()(model)
    folded = [value for name, value in graph.initializers.items() if name not in weights and value.const_value is not None]
    constants_back_to_nodes(graph, [value.name for value in folded if value.const_value.size <= _CONSTANT_NODE_LIMIT])
    for value in folded:
        if value.name in graph.initializers:
            value.metadata_props[FOLDED_KEY] = "constant"
    return before - len(graph)
