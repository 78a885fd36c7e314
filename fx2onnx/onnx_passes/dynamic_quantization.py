"""Dynamic int8 quantization of linear layers: ``MatMul(x, W)`` -> ``MatMulInteger``.

The form onnxruntime's ``quantize_dynamic`` writes, for encoders (BERT and the like),
where the activations of a whole sequence are quantized at run time::

    x_q, x_scale, x_zero = DynamicQuantizeLinear(x)          # uint8, per tensor
    y = Cast(MatMulInteger(x_q, W_q, x_zero, W_zero)) * (x_scale * W_scale) [+ bias]

onnxruntime's CPU provider fuses it into ``DynamicQuantizeMatMul`` when it loads the
model (see `bench/precision_folders.py` for the speed). The weight is int8, symmetric
(zero points 0), with a scale per output column (``MatMulInteger`` takes a zero point
per column): closer to float than ``quantize_dynamic``'s default scale per tensor at no
cost in speed. ``W_q`` is stored in MatMul's ``[K, N]`` layout, what the tools expect.

Each linear layer (`linear_layers`) is rewritten; layers reading one input (Q, K and V)
share its ``DynamicQuantizeLinear``. The codes and scales are `DerivedTensor`s, computed
when the model is written, one weight at a time (fake mode too). Only float32 layers:
``DynamicQuantizeLinear`` takes float32 only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir
import torch

from fx2onnx.onnx_passes.derived_weights import fresh_name, register_derived
from fx2onnx.onnx_passes.linear_layers import LinearLayer, linear_layers, replace_linear

_CODE_RANGE = 127  # symmetric int8: codes -127..127, as onnxruntime's symmetric weights


@dataclass
class DynamicQuantization:
    """What `quantize_linears_dynamically` changed."""

    quantized: list[str] = field(default_factory=list)  # weights now read by MatMulInteger
    kept_float: list[str] = field(default_factory=list)  # float16 layers (DynamicQuantizeLinear is float32 only)


def per_column_int8(weight_kn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 codes ``[K, N]`` and float32 scales ``[N]`` of a weight given as
    ``[K, N]``: each column's largest magnitude maps to 127."""
    matrix = weight_kn.detach().to(torch.float32)
    scales = matrix.abs().amax(0) / _CODE_RANGE
    safe = torch.where(scales == 0, torch.ones_like(scales), scales)
    codes = torch.round(matrix / safe).clamp_(-_CODE_RANGE, _CODE_RANGE).to(torch.int8)
    return codes, scales


def _derive(stored_nk: bool, names: list[str]):  # noqa: ANN202 - a Derive
    def derive(stored: torch.Tensor) -> dict[str, torch.Tensor]:
        codes, scales = per_column_int8(stored.t() if stored_nk else stored)
        return {names[0]: codes, names[1]: scales, names[2]: torch.zeros(scales.shape, dtype=torch.int8)}

    return derive


def _node(graph: ir.Graph, before: ir.Node, op_type: str, inputs: list[ir.Value], name: str, outputs: int = 1,
          **attributes: int) -> ir.Node:
    node = ir.node(op_type, inputs, attributes, num_outputs=outputs, name=name)
    graph.insert_before(before, node)
    return node


def _rewrite(graph: ir.Graph, linear: LinearLayer, quantized_inputs: dict[ir.Value, ir.Node]) -> None:
    weight, x = linear.weight, linear.node.inputs[0]
    assert weight.name is not None and weight.shape is not None and x is not None
    n = int(weight.shape[0 if linear.stored_nk else 1])
    k = int(weight.shape[1 if linear.stored_nk else 0])
    names = [fresh_name(graph, weight.name + suffix) for suffix in ("_quantized", "_scale", "_zero_point")]
    specs = [(names[0], ir.DataType.INT8, (k, n)), (names[1], ir.DataType.FLOAT, (n,)), (names[2], ir.DataType.INT8, (n,))]
    codes, scale, zero = register_derived(graph, weight, _derive(linear.stored_nk, names), specs)
    name = linear.node.name or weight.name
    first = linear.node
    if x not in quantized_inputs:  # one per input, before its first reader
        quantized_inputs[x] = _node(graph, first, "DynamicQuantizeLinear", [x], f"{name}/quantize_input", outputs=3)
    x_q, x_scale, x_zero = quantized_inputs[x].outputs
    product = _node(graph, first, "MatMulInteger", [x_q, codes, x_zero, zero], f"{name}/MatMulInteger").outputs[0]
    product = _node(graph, first, "Cast", [product], f"{name}/Cast", to=ir.DataType.FLOAT).outputs[0]
    scales = _node(graph, first, "Mul", [x_scale, scale], f"{name}/scales").outputs[0]
    output = _node(graph, first, "Mul", [product, scales], f"{name}/scaled").outputs[0]
    if linear.bias is not None:
        output = _node(graph, first, "Add", [output, linear.bias], f"{name}/bias").outputs[0]
    replace_linear(graph, linear, output)


def quantize_linears_dynamically(model: ir.Model) -> DynamicQuantization:
    """Make every float32 linear layer of ``model``'s main graph an int8 ``MatMulInteger``
    of its dynamically quantized input (see the module docstring)."""
    graph = model.graph
    report = DynamicQuantization()
    quantized_inputs: dict[ir.Value, ir.Node] = {}
    for linear in linear_layers(graph):
        assert linear.weight.name is not None
        if linear.weight.dtype != ir.DataType.FLOAT:
            report.kept_float.append(linear.weight.name)
            continue
        _rewrite(graph, linear, quantized_inputs)
        report.quantized.append(linear.weight.name)
    return report
