"""The model laid out as the tools people run on an ONNX file look for it.

onnxruntime's quantizers, its transformers optimizer and its fusions of quantized
operators pattern-match on a few shapes of graph; the steps below give them those shapes,
in order (the integer products need the weights' final layout), in every mode (module
functions, fake mode: no step reads weight data it does not have).
"""

from __future__ import annotations

import onnx_ir as ir

from fx2onnx.onnx_passes.constant_form import constants_as_tensors
from fx2onnx.onnx_passes.dequantized_arguments import dequantize_inside_functions
from fx2onnx.onnx_passes.quantized_matmul import gemms_of_dequantized_as_matmuls, integer_matmuls
from fx2onnx.onnx_passes.weight_layout import store_weights_transposed, store_zero_points_quantized

# Each step edits the model in place.
TOOL_LAYOUT_STEPS = (
    dequantize_inside_functions,  # a function multiplying dequantized tensors dequantizes them itself
    gemms_of_dequantized_as_matmuls,  # a quantized linear on a 2-D input as MatMul, its weight read transposed
    store_weights_transposed,  # a linear weight as its MatMul reads it, no Transpose before it
    store_zero_points_quantized,  # zero points stored in their quantized type, not cast at run time
    integer_matmuls,  # a product of two dequantized 8-bit operands as MatMulInteger
    constants_as_tensors,  # Constants as `value` tensors, which shape inference reads
)


def lay_out_for_tools(model: ir.Model) -> None:
    """Run every step of :data:`TOOL_LAYOUT_STEPS` on ``model``, in place."""
    for step in TOOL_LAYOUT_STEPS:
        step(model)
