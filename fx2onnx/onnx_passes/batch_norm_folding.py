"""Batch normalization folded into the convolution or linear layer before it.

In inference, ``BatchNormalization(Conv(x, W, B))`` is ``Conv(x, W', B')`` with the
weights scaled by ``gamma / sqrt(var + eps)`` (onnxscript's fusion rules compute them).
The folded weights are new tensors under the convolution's names: they are marked
(`FOLDED_KEY` in the initializer's metadata) so that `ONNXProgram.save(model_state=...)`
refuses a checkpoint, whose weights are the unfolded ones. Weights without data (fake
mode) cannot be folded: the graph keeps its BatchNormalization nodes.
"""

from __future__ import annotations

import onnx_ir as ir

from fx2onnx.onnx_passes.fake_weights import FOLDED_KEY, fake_weights

_LAYERS = ("Conv", "ConvTranspose", "Gemm")
_RULE_KEY = "pkg.onnxscript.rewriter.rule_name"


def fold_batch_norms(model: ir.Model) -> int:
    """Fold every BatchNormalization of the main graph that follows a Conv, ConvTranspose
    or Gemm whose weights are initializers; returns how many were folded."""
    from onnxscript.rewriter import RewritePass, RewriteRuleSet
    from onnxscript.rewriter.rules import common as rules

    graph = model.graph
    if fake_weights(model) or not any(node.op_type == "BatchNormalization" and node.domain == "" for node in graph):
        return 0
    before = {name: value.const_value for name, value in graph.initializers.items()}
    # the folded layer keeps the name and module metadata of the layer it replaces
    layers = {
        node.inputs[1].name: (node.name, dict(node.metadata_props))
        for node in graph if node.op_type in _LAYERS and len(node.inputs) > 1 and node.inputs[1] is not None
    }
    count = sum(node.op_type == "BatchNormalization" for node in graph)
    rule_set = RewriteRuleSet([
        rules.fuse_batchnorm_into_conv_rule,
        rules.fuse_batchnorm_into_conv_transpose_rule,
        rules.fuse_batchnorm_into_gemm_rule,
    ])
    ir.passes.Sequential(RewritePass(rule_set), ir.passes.common.RemoveUnusedNodesPass())(model)
    for node in graph:
        if node.op_type in _LAYERS and node.metadata_props.get(_RULE_KEY, "").startswith("FuseBatchNorm"):
            node.name, metadata = layers.get(node.inputs[1].name, (node.name, {}))
            node.metadata_props.clear()
            node.metadata_props.update(metadata)
            _name_bias_after_weight(graph, node)
    for name, value in graph.initializers.items():
        if before.get(name) is not value.const_value:
            value.metadata_props[FOLDED_KEY] = "batch_norm"
    return count - sum(node.op_type == "BatchNormalization" for node in graph)


def folded_weights(model: ir.Model) -> list[str]:
    """The initializers computed at export from the model's weights (batch norm or
    constant folding): their values are not a checkpoint's."""
    return [name for name, value in model.graph.initializers.items() if FOLDED_KEY in value.metadata_props]


def _name_bias_after_weight(graph: ir.Graph, node: ir.Node) -> None:
    """A bias the folding created (``conv.weight_bias``) named as PyTorch would (``conv.bias``)."""
    weight, bias = node.inputs[1], node.inputs[2]
    if weight is None or bias is None or not (weight.name or "").endswith(".weight"):
        return
    wanted = weight.name[: -len("weight")] + "bias"
    if bias.name == weight.name + "_bias" and wanted not in graph.initializers:
        graph.initializers.pop(bias.name)
        bias.name = wanted
        graph.register_initializer(bias)
