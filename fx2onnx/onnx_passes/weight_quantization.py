"""Weight-only quantization of linear layers: ``MatMul(x, W)`` -> ``com.microsoft.MatMulNBits``.

The runtime's own CPU form of an int4 or int8 LLM (what ONNX Runtime GenAI's model
builder writes for ``-p int4 -e cpu``): each linear layer keeps float activations and
reads its weight as block-wise integer codes with a scale per block (`nbits_packing`).
At accuracy level 4 onnxruntime's CPU kernel quantizes the activations to int8 on the
fly and multiplies in integers, which is where the speed comes from.

Each linear layer (`linear_layers`) becomes one MatMulNBits, its bias the kernel's bias
input. Its codes and scales are `DerivedTensor`s: computed from the weight when the model is written, one weight at
a time, from the program's weight or the checkpoint's (fake mode). The float weight goes
when nothing else reads it; an embedding's Gather keeps reading a shared one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir
import torch

from fx2onnx.onnx_passes.derived_weights import fresh_name, register_derived
from fx2onnx.onnx_passes.linear_layers import LinearLayer, linear_layers, lm_head, replace_linear
from fx2onnx.onnx_passes.nbits_packing import pack_weight, packed_shapes

MS_DOMAIN = "com.microsoft"
# onnxruntime's CPU MatMulNBits computes in these activation types
_ACTIVATION_TYPES = {ir.DataType.FLOAT: torch.float32, ir.DataType.FLOAT16: torch.float16}


@dataclass(frozen=True)
class WeightQuantization:
    """How linear layers' weights are quantized.

    Args:
        bits: 4 or 8.
        block_size: rows of W (along K) sharing a scale; a power of two, at least 16.
            32, as the model builder's CPU default, keeps int4 close to float.
        accuracy_level: MatMulNBits' minimum accuracy of the activations: 4 (int8
            activations, the fast CPU path), 0 or 1 (float activations).
        symmetric: no zero points (the implicit 2 ** (bits - 1)); False stores one per block.
        lm_head: quantize the language-model head too (the builder's default for int4).
        embedding: quantize the token embedding too, as ``GatherBlockQuantized`` with the
            same bits and blocks (`embedding_quantization`; the builder's ``int4`` does
            not by default).
    """

    bits: int = 4
    block_size: int = 32
    accuracy_level: int = 4
    symmetric: bool = True
    lm_head: bool = True
    embedding: bool = False

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"weight quantization has 4 or 8 bits, not {self.bits}.")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ValueError(f"the block size must be a power of two of at least 16 (MatMulNBits); got {self.block_size}.")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise ValueError(f"the accuracy level is 0 to 4 (MatMulNBits); got {self.accuracy_level}.")


@dataclass
class QuantizedLinears:
    """What `quantize_linear_weights` changed."""

    quantized: list[str] = field(default_factory=list)  # weights now read by MatMulNBits
    kept_float: list[str] = field(default_factory=list)  # linear weights left float (the LM head when asked)


def _derive(linear: LinearLayer, config: WeightQuantization, names: list[str]):  # noqa: ANN202 - a Derive
    stored_nk = linear.stored_nk
    scales_type = _ACTIVATION_TYPES[linear.weight.dtype]  # type: ignore[index]

    def derive(stored: torch.Tensor) -> dict[str, torch.Tensor]:
        # MatMulNBits reads W as [N, K]: the transpose of MatMul's [K, N]
        packed = pack_weight(stored if stored_nk else stored.t(), config.bits, config.block_size, config.symmetric)
        outputs = {names[0]: packed.codes, names[1]: packed.scales.to(scales_type)}
        if packed.zero_points is not None:
            outputs[names[2]] = packed.zero_points
        return outputs

    return derive


def _rewrite(graph: ir.Graph, linear: LinearLayer, config: WeightQuantization) -> None:
    weight = linear.weight
    assert weight.name is not None and weight.shape is not None and weight.dtype is not None
    rows, cols = (int(d) for d in weight.shape)
    n, k = (rows, cols) if linear.stored_nk else (cols, rows)
    suffixes = [f"_Q{config.bits}", "_scales"] + ([] if config.symmetric else ["_zero_points"])
    names = [fresh_name(graph, weight.name + suffix) for suffix in suffixes]
    shapes = packed_shapes(n, k, config.bits, config.block_size)
    dtypes = [ir.DataType.UINT8, weight.dtype, ir.DataType.UINT8]
    derived = register_derived(graph, weight, _derive(linear, config, names), list(zip(names, dtypes, shapes)))
    inputs: list[ir.Value | None] = [linear.node.inputs[0], *derived]
    if linear.bias is not None:  # inputs: A, B, scales, zero_points, g_idx, bias
        inputs += [None] * (5 - len(inputs)) + [linear.bias]
    attributes = {"K": k, "N": n, "bits": config.bits, "block_size": config.block_size, "accuracy_level": config.accuracy_level}
    node = ir.node("MatMulNBits", inputs, attributes, domain=MS_DOMAIN, name=linear.node.name)
    graph.insert_after(linear.bias_add or linear.node, node)
    replace_linear(graph, linear, node.outputs[0])


def quantize_linear_weights(model: ir.Model, config: WeightQuantization, lm_head_output: str = "logits") -> QuantizedLinears:
    """Make every linear layer of ``model``'s main graph a ``MatMulNBits`` (weights
    computed when written; see the module docstring)."""
    graph = model.graph
    head = None if config.lm_head else lm_head(graph, lm_head_output)
    report = QuantizedLinears()
    for linear in linear_layers(graph):
        assert linear.weight.name is not None
        if linear.node is head:
            report.kept_float.append(linear.weight.name)
            continue
        _rewrite(graph, linear, config)
        report.quantized.append(linear.weight.name)
    if report.quantized and MS_DOMAIN not in model.opset_imports:
        model.opset_imports[MS_DOMAIN] = 1
    return report
