"""Nodes computable from the weights alone, folded (the portable target).

The optimizer leaves nodes that read weights (so that the weights keep their names for
`ONNXProgram.save(model_state=...)`). A portable file folds them as well: a runtime
without constant folding of its own (TVM's frontend, onnxruntime-web's WebGPU placement)
then computes nothing at every call that it could have known at export (rotary tables
from ``inv_freq``, ``Slice`` of ``position_ids``, embeddings of constant indices at static
shapes). A node that only gives a whole weight another layout or type (a ``Transpose`` of
a linear weight) is left to the tools' layout, which stores the weight as it is read
under its own name. Nodes the folder's evaluator cannot compute are computed by
onnxruntime (`fx2onnx.onnx_passes.runtime_folding`). The folded results keep onnxscript's limits on the size of what is folded (a
node whose output would exceed them stays); they are initializers marked as folded,
which `save(model_state=...)` then refuses (a checkpoint holds the weights they come
from). A model with weights without data (fake mode) is left as it is: the checkpoint
gives its weights when it is written.

The portable file then keeps every constant as an initializer, as torch.onnx writes them
(`constants_as_initializers`): a Constant node is no computation, and runtimes count
nodes. They are marked (`CONSTANT_KEY`): `save(include_initializers=False)` keeps them in
the file, only weights become inputs.
"""

from __future__ import annotations

import functools
import math

import onnx_ir as ir

from fx2onnx.onnx_passes.fake_weights import CONSTANT_KEY, FOLDED_KEY, fake_weights
from fx2onnx.onnx_passes.runtime_folding import fold_with_onnxruntime



def _not_a_whole_weight(weights: set[str], node: ir.Node) -> bool | None:
    """False for a node that gives a whole weight another layout or type (a Transpose or
    Cast of it: as many elements out as a weight it reads has), which would replace the named
    weight by an anonymous copy; the tools' layout stores such a weight as it is read,
    under its own name. None otherwise: the folder's own rules decide."""
    read = [value.const_value.size for value in node.inputs
            if value is not None and value.name in weights and value.const_value is not None]
    if not read:
        return None
    shape = node.outputs[0].shape if node.outputs else None
    if shape is None or not shape.is_static():
        return False
    return False if math.prod(shape.numpy()) in read else None


def fold_weight_reads(model: ir.Model) -> int:
    """Fold the main graph's nodes whose inputs are all weights or constants; returns how
    many nodes the graph lost."""
    from onnxscript.optimizer import fold_constants_ir

    graph = model.graph
    if fake_weights(model):
        return 0
    before, weights = len(graph), set(graph.initializers)
    keeps_whole_weights = functools.partial(_not_a_whole_weight, weights)
    fold_constants_ir(model, onnx_shape_inference=False, should_fold=keeps_whole_weights)
    # what the folder's evaluator could not compute
    fold_with_onnxruntime(graph, model.opset_imports.get("", 18), lambda node: keeps_whole_weights(node) is not False,
                          as_initializers=True)
    ir.passes.common.RemoveUnusedNodesPass()(model)
    for name, value in graph.initializers.items():
        if name not in weights:
            value.metadata_props[FOLDED_KEY] = "constant"
    return before - len(graph)


def constants_as_initializers(model: ir.Model) -> int:
    """Every Constant node of the main graph as an initializer of its output's name,
    marked with `CONSTANT_KEY`; returns how many."""
    graph = model.graph
    before = set(graph.initializers)
    ir.passes.common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
    lifted = [value for name, value in graph.initializers.items() if name not in before]
    for value in lifted:
        value.metadata_props[CONSTANT_KEY] = "true"
    return len(lifted)
