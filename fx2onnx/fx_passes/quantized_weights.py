"""Linear layers whose weight is stored quantized stay quantized in the ONNX model.

torchao's weight-only configurations (``quantize_(model, IntxWeightOnlyConfig(...))``)
keep each weight as integers with a scale (and zero point) per group of input features;
the captured graph dequantizes it (``torchao::dequantize_affine``) and multiplies in
float. Translated as it stands, onnxruntime folds that dequantization into a float weight
when it loads the model: the file is small, the model in memory is not, and nothing is
faster. Here such a ``linear`` becomes ``fx2onnx::weight_only_linear``, which the
dispatcher writes as onnxruntime's ``MatMulNBits`` on the stored integers (for
``ExportOptions(runtime="onnxruntime")``; other runtimes get the dequantization in ONNX
operators).
"""

from __future__ import annotations

import torch

from diagnostics import DiagnosticContext, Level, rules
from dispatcher.functions.quantized import kernel_block
from dispatcher.fx_nodes import node_value
from fx2onnx.fx_passes.fused_kernels import operators  # noqa: F401 - registers torch.ops.fx2onnx.*
from fx2onnx.fx_passes.node_meta import call_in_place_of
from fx2onnx.private_ops import torch_op

# the integer ranges MatMulNBits stores (bits -> (quant_min, quant_max) of torchao's signed form)
_BITS_OF_RANGE = {(-8, 7): 4, (-128, 127): 8}


def _dequantize_affine_target() -> object | None:
    # None without torchao imported: then no such node can be in the graph
    return torch_op("torchao.dequantize_affine.default")


def _group_size(dequantize: torch.fx.Node) -> int | str:
    """The group of input features one scale covers, or why the weight is not one
    MatMulNBits reads."""
    qdata, block_size = dequantize.args[0], dequantize.args[1]
    value = node_value(qdata)
    if value is None or value.dim() != 2 or value.dtype != torch.int8:
        return "the weight is not an int8 matrix"
    if len(block_size) != 2 or block_size[0] != 1:
        return f"block size {list(block_size)} is not one row by a group of input features"
    group = int(block_size[1])
    if int(value.shape[1]) % group:
        return f"{value.shape[1]} input features are not a whole number of groups of {group}"
    if kernel_block(group) is None:
        return f"groups of {group} input features are not a multiple of 16, the smallest block MatMulNBits runs"
    return group


def _bits(dequantize: torch.fx.Node) -> int | None:
    args = [*dequantize.args, None, None, None][:7]
    input_dtype, quant_min, quant_max = args[4], args[5], args[6]
    if input_dtype not in (torch.int8, None):
        return None
    return _BITS_OF_RANGE.get((quant_min, quant_max))


def fuse_weight_only_linears(graph_module: torch.fx.GraphModule) -> list[str]:
    """Replace each ``linear`` of a torchao-dequantized weight by
    ``fx2onnx::weight_only_linear``, in place; the reasons of the ones kept as they are."""
    target = _dequantize_affine_target()
    if target is None:
        return []
    graph, kept = graph_module.graph, []
    for node in [n for n in graph.nodes if n.target is torch.ops.aten.linear.default]:
        weight = node.args[1]
        if not isinstance(weight, torch.fx.Node) or weight.target is not target:
            continue
        group, bits = _group_size(weight), _bits(weight)
        if isinstance(group, str) or bits is None:
            kept.append(f"`{node.name}`: " + (group if isinstance(group, str) else "not a 4- or 8-bit signed range"))
            continue
        qdata, _, scale, zero_point = weight.args[:4]
        bias = node.args[2] if len(node.args) > 2 else None
        arguments = (node.args[0], qdata, scale, zero_point, bias, group, bits)
        with graph.inserting_before(node):
            fused = call_in_place_of(
                graph, torch.ops.fx2onnx.weight_only_linear.default, arguments, {}, node.meta, node.meta["val"].fake_mode,
                like=node.meta["val"],
            )
        node.replace_all_uses_with(fused)
        graph.erase_node(node)
        if not weight.users:
            graph.erase_node(weight)
    graph_module.recompile()
    return kept


def _stored_int8_matrix(node: object) -> torch.fx.Node | None:
    """The int8 (N, K) weight ``W`` of ``to_float(t(W))``, or None."""
    if not isinstance(node, torch.fx.Node) or node.target is not torch.ops.aten._to_copy.default:
        return None
    if node.kwargs.get("dtype") not in (torch.float32, torch.float16, torch.bfloat16):
        return None
    transposed = node.args[0]
    if not isinstance(transposed, torch.fx.Node) or transposed.target is not torch.ops.aten.t.default:
        return None
    weight = transposed.args[0]
    value = node_value(weight)
    if value is None or value.dtype != torch.int8 or value.dim() != 2:
        return None
    return weight


def _column_scale(node: object, columns: int) -> torch.fx.Node | None:
    """``node`` when it is a float vector of one scale per output column."""
    value = node_value(node)
    if value is None or not value.is_floating_point() or tuple(value.shape) != (columns,):
        return None
    return node


def fuse_scaled_integer_matmuls(graph_module: torch.fx.GraphModule) -> int:
    """Replace each ``mm(x, to_float(t(W))) * scale``, an int8 weight scaled per output
    column (torchao's ``Int8WeightOnlyConfig``), by ``fx2onnx::weight_only_linear``, in
    place; how many. The scaling moves from the product to the weight: the same numbers
    up to float rounding."""
    graph, fused = graph_module.graph, 0
    for node in [n for n in graph.nodes if n.target is torch.ops.aten.mul.Tensor]:
        product, scale = node.args[0], node.args[1]
        if not isinstance(product, torch.fx.Node) or product.target is not torch.ops.aten.mm.default:
            continue
        weight = _stored_int8_matrix(product.args[1])
        rows, features = (tuple(weight.meta["val"].shape) if weight is not None else (0, 0))
        if weight is None or _column_scale(scale, rows) is None or kernel_block(features) is None:
            continue
        fake_mode = node.meta["val"].fake_mode
        with graph.inserting_before(node):
            per_row = call_in_place_of(graph, torch.ops.aten.view.default, (scale, [rows, 1]), {}, node.meta, fake_mode)
            arguments = (product.args[0], weight, per_row, None, None, features, 8)
            replacement = call_in_place_of(
                graph, torch.ops.fx2onnx.weight_only_linear.default, arguments, {}, node.meta, fake_mode,
                like=node.meta["val"],
            )
        node.replace_all_uses_with(replacement)
        graph.erase_node(node)
        fused += 1
    graph.eliminate_dead_code()
    graph_module.recompile()
    return fused


def keep_quantized_weights(graph_module: torch.fx.GraphModule, context: DiagnosticContext) -> int:
    """Every linear layer of a weight stored quantized as ``fx2onnx::weight_only_linear``
    (onnxruntime's MatMulNBits), in place; one warning names those that stay dequantized
    to float, and why. How many were replaced."""
    kept = fuse_weight_only_linears(graph_module)
    if kept:
        context.record(
            rules.FX_PASS, Level.WARNING, pass_name="keep_quantized_weights",
            message=f"{len(kept)} quantized linear layer(s) are dequantized to float in the ONNX model "
            f"(onnxruntime then holds float weights): {'; '.join(kept[:5])}.",
        )
    fuse_scaled_integer_matmuls(graph_module)
    return sum(node.target is torch.ops.fx2onnx.weight_only_linear.default for node in graph_module.graph.nodes)
