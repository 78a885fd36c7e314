"""Weight-only quantization of linear layers: ``MatMul(x, W)`` -> ``com.microsoft.MatMulNBits``.

The runtime's own CPU form of an int4 or int8 LLM (what ONNX Runtime GenAI's model
builder writes for ``-p int4 -e cpu``): each linear layer keeps float activations and
reads its weight as block-wise integer codes with a scale per block (`nbits_packing`).
At accuracy level 4 onnxruntime's CPU kernel quantizes the activations to int8 on the
fly and multiplies in integers, which is where the speed comes from.

Each linear layer (`linear_layers`) becomes one MatMulNBits, its bias the kernel's bias
input, in the main graph and in module functions (their weights are parameters: the
codes and scales reach them as parameters too, `derived_arguments`). Its codes and scales are `DerivedTensor`s: computed from the weight when the model is written, one weight at
a time, from the program's weight or the checkpoint's (fake mode). The float weight goes
when nothing else reads it; an embedding's Gather keeps reading a shared one. The LM head
may have its own block size and algorithm (`WeightQuantization.of_lm_head`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir
import torch

from fx2onnx.onnx_passes.derived_arguments import DerivedArguments, MakeDerived
from fx2onnx.onnx_passes.derived_weights import Derive
from fx2onnx.onnx_passes.function_calls import FunctionCalls
from fx2onnx.onnx_passes.linear_layers import LinearLayer, linear_layers, lm_head, replace_linear
from fx2onnx.onnx_passes.model_graphs import model_graphs
from fx2onnx.onnx_passes.nbits_packing import PackedWeight, pack_weight, packed_shapes
from fx2onnx.options import WeightQuantization

MS_DOMAIN = "com.microsoft"
# onnxruntime's CPU MatMulNBits computes in these activation types
_ACTIVATION_TYPES = {ir.DataType.FLOAT: torch.float32, ir.DataType.FLOAT16: torch.float16}


@dataclass
class QuantizedLinears:
    """What `quantize_linear_weights` changed."""

    quantized: list[str] = field(default_factory=list)  # weights now read by MatMulNBits
    kept_float: list[str] = field(default_factory=list)  # linear weights left float (the LM head when asked)


def _checked(packed: PackedWeight, name: str | None, shapes: tuple[tuple[int, ...], ...], symmetric: bool) -> PackedWeight:
    """A checkpoint's packed weight, refused unless laid out as the layer's MatMulNBits reads it."""
    found = (tuple(packed.codes.shape), tuple(packed.scales.shape))
    if found != shapes[:2] or (packed.zero_points is None) != symmetric or (
        packed.zero_points is not None and tuple(packed.zero_points.shape) != shapes[2]
    ):
        raise ValueError(f"the given codes of {name!r} are laid out as {found} (zero points: {packed.zero_points is not None}), "
                         f"not as MatMulNBits reads this layer: {shapes[:2]} (zero points: {not symmetric}).")
    return packed


def _make_derived(stored_nk: bool, config: WeightQuantization, bits: int) -> MakeDerived:
    """How the codes, scales (and zero points) of a weight are computed, for any weight
    read as this layer reads it."""

    def make(weight: ir.Value, names: list[str]) -> tuple[Derive, list[tuple[str, ir.DataType, tuple[int, ...]]]]:
        assert weight.shape is not None and weight.dtype is not None
        rows, cols = (int(d) for d in weight.shape)
        n, k = (rows, cols) if stored_nk else (cols, rows)
        scales_type = _ACTIVATION_TYPES[weight.dtype]

        given = config.codes_of(weight.name) if config.codes_of is not None and weight.name else None
        shapes = packed_shapes(n, k, bits, config.block_size)

        def derive(stored: torch.Tensor) -> dict[str, torch.Tensor]:
            if given is not None:  # the checkpoint's own codes, not the weight's
                packed = _checked(given(), weight.name, shapes, config.symmetric)
            else:  # MatMulNBits reads W as [N, K]: the transpose of MatMul's [K, N]
                packed = pack_weight(
                    stored if stored_nk else stored.t(), bits, config.block_size, config.symmetric, config.algorithm
                )
            outputs = {names[0]: packed.codes, names[1]: packed.scales.to(scales_type)}
            if packed.zero_points is not None:
                outputs[names[2]] = packed.zero_points
            return outputs

        dtypes = [ir.DataType.UINT8, weight.dtype, ir.DataType.UINT8]
        return derive, list(zip(names, dtypes, shapes))

    return make


def _rewrite(container: ir.Graph | ir.Function, linear: LinearLayer, config: WeightQuantization,
             arguments: DerivedArguments) -> None:
    weight = linear.weight
    assert weight.name is not None and weight.shape is not None and weight.dtype is not None
    rows, cols = (int(d) for d in weight.shape)
    n, k = (rows, cols) if linear.stored_nk else (cols, rows)
    if config.int8_layers and not weight.is_initializer():
        # a function's body is shared by its calls: one bit width for all their weights
        raise NotImplementedError(
            f"WeightQuantization.int8_layers chooses bits per weight, but {weight.name!r} is a module function's "
            "parameter: export without module functions for mixed precision, or give no int8_layers."
        )
    bits = config.bits_of(weight.name)
    suffixes = [f"_Q{bits}", "_scales"] + ([] if config.symmetric else ["_zero_points"])
    derived = arguments.derived(weight, suffixes, _make_derived(linear.stored_nk, config, bits))
    inputs: list[ir.Value | None] = [linear.node.inputs[0], *derived]
    if linear.bias is not None:  # inputs: A, B, scales, zero_points, g_idx, bias
        inputs += [None] * (5 - len(inputs)) + [linear.bias]
    attributes = {"K": k, "N": n, "bits": bits, "block_size": config.block_size, "accuracy_level": config.accuracy_level}
    node = ir.node("MatMulNBits", inputs, attributes, domain=MS_DOMAIN, name=linear.node.name)
    container.insert_after(linear.bias_add or linear.node, node)
    if isinstance(container, ir.Function):
        container.opset_imports.setdefault(MS_DOMAIN, 1)
    replace_linear(container, linear, node.outputs[0])
    arguments.drop_if_unread(weight)  # a parameter: its float weight goes with the last reader


def _kept_float_by_checkpoint(config: WeightQuantization, linear: LinearLayer) -> bool:
    """A layer a pre-quantized checkpoint keeps float (`WeightQuantization.codes_of`)."""
    if config.codes_of is None:
        return False
    if not linear.weight.is_initializer():
        raise NotImplementedError(
            f"WeightQuantization.codes_of reads codes by weight name, but {linear.weight.name!r} is a module function's "
            "parameter: export a pre-quantized checkpoint without module functions."
        )
    assert linear.weight.name is not None
    return config.codes_of(linear.weight.name) is None


def _head_config(config: WeightQuantization, head: LinearLayer) -> WeightQuantization:
    assert head.weight.shape is not None
    rows, cols = (int(d) for d in head.weight.shape)
    return config.of_lm_head(cols if head.stored_nk else rows)


def quantize_linear_weights(model: ir.Model, config: WeightQuantization, lm_head_output: str = "logits") -> QuantizedLinears:
    """Make every linear layer of ``model`` whose weight is stored (in the main graph, or
    given to a module function by every call) a ``MatMulNBits`` (weights computed when
    written; see the module docstring)."""
    calls = FunctionCalls(model)
    head = lm_head(model.graph, lm_head_output, calls)
    arguments = DerivedArguments(model, calls)
    report = QuantizedLinears()
    for container in model_graphs(model):
        for linear in linear_layers(container, calls.is_initializer_behind):
            assert linear.weight.name is not None
            if (linear.node is head and not config.lm_head) or _kept_float_by_checkpoint(config, linear):
                report.kept_float.append(linear.weight.name)
                continue
            _rewrite(container, linear, _head_config(config, linear) if linear.node is head else config, arguments)
            report.quantized.append(linear.weight.name)
    if report.quantized and MS_DOMAIN not in model.opset_imports:
        model.opset_imports[MS_DOMAIN] = 1
    return report
