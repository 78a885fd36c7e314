"""Stage 4, ONNX passes: from a translated model to a valid, fast one.

Takes the `ir.Model`; gives it with types onnxruntime's kernels accept (`legalize_types`,
`cpu_kernel_types`), optimized (`optimization`, `layout_rules`) and validated by ONNX's
checker and strict inference (`validate_model`); a linear layer's bias of zeros is left
out (`zero_biases`). Weights without data (fake mode) are
hidden from the passes and the checker (`fake_weights`). The opset the user asks for is
reached last, before validation (`opset_conversion`); then the fused kernels, written
in a domain of their own until the opset is final, join the standard domain
(`fused_kernel_domain`); for onnxruntime, a residual addition and the RMS norm of its sum
become its one kernel (`skip_normalization`). On request (`ExportOptions.precision`), linear layers become onnxruntime's weight-only
`MatMulNBits` (`weight_quantization`), whose codes are computed from each weight when the
model is written (`derived_weights`; given to module functions as parameters,
`derived_arguments`). Every pass walks the model with `model_graphs` and sees through
module-function calls with `function_calls`; a computation of many small nodes is written
with `AppendedNodes` (`appended_nodes`). The passes run in the order of `ONNX_PASS_STEPS`,
the stage's entry `run_onnx_passes` (`onnx_pass_steps`).
"""

from dispatcher.functions.fused import ONNXRUNTIME_DOMAIN
from fx2onnx.onnx_passes.appended_nodes import AppendedNodes
from fx2onnx.onnx_passes.block_scales import QUANTIZATION_ALGORITHMS
from fx2onnx.onnx_passes.derived_weights import source_weight_names
from fx2onnx.onnx_passes.dynamic_quantization import quantize_linears_dynamically
from fx2onnx.onnx_passes.fake_weights import CONSTANT_KEY, FOLDED_KEY
from fx2onnx.onnx_passes.embedding_quantization import quantize_embeddings
from fx2onnx.onnx_passes.model_graphs import model_graphs
from fx2onnx.onnx_passes.nbits_packing import PackedWeight, pack_codes, rounded_weight
from fx2onnx.onnx_passes.opset_conversion import check_opset_version, newest_opset
from fx2onnx.onnx_passes.packed_projections import pack_projections
from fx2onnx.onnx_passes.rename_dims import rename_dims
from fx2onnx.onnx_passes.weight_quantization import WeightQuantization, quantize_linear_weights

__all__ = [
    "AppendedNodes",
    "CONSTANT_KEY",
    "FOLDED_KEY",
    "ONNXRUNTIME_DOMAIN",
    "PackedWeight",
    "QUANTIZATION_ALGORITHMS",
    "WeightQuantization",
    "check_opset_version",
    "model_graphs",
    "newest_opset",
    "pack_codes",
    "pack_projections",
    "quantize_embeddings",
    "quantize_linear_weights",
    "quantize_linears_dynamically",
    "rename_dims",
    "rounded_weight",
    "source_weight_names",
]
