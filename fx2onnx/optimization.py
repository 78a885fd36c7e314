"""The optimization stage: onnxscript's optimizer, keeping what fx2onnx promises.

onnxscript's optimizer folds constants, removes dead code and applies its rewrite rules.
Three things of the exported model must survive it:

- module functions: the optimizer inlines every function unless told not to;
- parameter names: folding a node that reads a weight (a Transpose, a Slice of a fused
  projection) would replace the named initializer with an anonymous constant, so nodes
  reading initializers are not folded (onnxruntime folds them itself at load time);
- the model's opset imports of domains used only inside functions;
- initializers are the model's weights: the constants the optimizer lifts into
  initializers become Constant nodes again.
"""

from __future__ import annotations

import onnx_ir as ir

from fx2onnx.model_writer import fake_weights_hidden


def _reads_an_initializer(node: ir.Node) -> bool | None:
    if any(value is not None and value.is_initializer() for value in node.inputs):
        return False
    return None  # the optimizer's own rules decide


def optimize_keeping_functions(model: ir.Model) -> None:
    """Optimize `model` in place; module functions, weight names and imports are kept."""
    import onnxscript.optimizer

    weights = set(model.graph.initializers)
    with fake_weights_hidden(model):  # fake-mode weights have no data to fold
        onnxscript.optimizer.optimize_ir(model, inline=False, should_fold=_reads_an_initializer)
    _constants_back_to_nodes(model.graph, weights)
    for function in model.functions.values():
        for domain, version in function.opset_imports.items():
            model.graph.opset_imports.setdefault(domain, version)


def _constants_back_to_nodes(graph: ir.Graph, weights: set[str]) -> None:
    """Turn initializers that are not weights (constants the optimizer lifted) back into
    Constant nodes at the start of the graph."""
    lifted = [n for n, v in graph.initializers.items() if n not in weights and v.const_value is not None]
    for name in lifted:
        value = graph.initializers.pop(name)
        node = ir.node("Constant", [], attributes={"value": value.const_value})
        node.outputs[0].name, node.outputs[0].type, node.outputs[0].shape = name, value.type, value.shape
        value.replace_all_uses_with(node.outputs[0], replace_graph_outputs=True)
        if len(graph):
            graph.insert_before(graph[0], node)
        else:
            graph.append(node)
