"""The ONNX passes' stage as one ordered list of steps, `ONNX_PASS_STEPS`, and its entry
`run_onnx_passes`: from the translated model to one onnxruntime and ONNX's checker take.

The portable target's library function calls inlined (its file holds no functions), types
first (onnxruntime's kernels), then the optimizer (and, for the portable target,
batch normalization folded into the layer before it and the nodes that read only
weights folded; otherwise the additions of biases of zeros left out), the opset asked for, the fused
kernels joining the standard domain once the opset is final, residual additions and RMS
norms as onnxruntime's one kernel, onnxruntime's cached attention guarded, float8 (which
needs opset 19 or newer), the layout the tools look for (`TOOL_LAYOUT_STEPS`), the weight
quantization asked for (`ExportOptions.precision`: weight-only, or an encoder's dynamic
int8, and the projections that read one input packed), the outputs of operators ONNX does not know typed where they leave
a function body, and ONNX's checker last.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir
import torch.fx

from diagnostics import DiagnosticContext
from fx2onnx.onnx_passes.batch_norm_folding import fold_batch_norms
from fx2onnx.onnx_passes.cached_attention_guard import guard_group_query_attention
from fx2onnx.onnx_passes.decoder_stack_guard import guard_decoder_stack
from fx2onnx.onnx_passes.dynamic_quantization import quantize_linears_dynamically
from fx2onnx.onnx_passes.embedding_quantization import quantize_embeddings
from fx2onnx.onnx_passes.float8 import legalize_float8
from fx2onnx.onnx_passes.expert_weights import write_expert_weights
from fx2onnx.onnx_passes.fallback_inputs import move_into_fallbacks
from fx2onnx.onnx_passes.fused_kernel_domain import lower_fused_kernels
from fx2onnx.onnx_passes.legalize_types import inline_library_functions, legalize_types
from fx2onnx.onnx_passes.opset_conversion import convert_to_opset
from fx2onnx.onnx_passes.optimization import optimize_keeping_functions
from fx2onnx.onnx_passes.packed_attention_inputs import pack_attention_inputs
from fx2onnx.onnx_passes.packed_float_projections import pack_float_projections
from fx2onnx.onnx_passes.packed_projections import pack_projections
from fx2onnx.onnx_passes.rotary_in_attention import TABLE_POSITIONS
from fx2onnx.onnx_passes.skip_normalization import fuse_skip_normalizations
from fx2onnx.onnx_passes.tool_layout import lay_out_for_tools
from fx2onnx.onnx_passes.unknown_op_types import type_unknown_op_outputs
from fx2onnx.onnx_passes.validate_model import validate_model
from fx2onnx.onnx_passes.weight_folding import constants_as_initializers, fold_weight_reads
from fx2onnx.onnx_passes.weight_quantization import quantize_linear_weights
from fx2onnx.onnx_passes.zero_biases import drop_zero_biases
from fx2onnx.options import ExportOptions, WeightQuantization
from fx2onnx.stage_timer import StageTimer
from fx2onnx.steps import Step, StepRecord, StepResult, run_steps


@dataclass
class OnnxPassState:
    """The ONNX model the passes edit in place, and the FX graph it came from (the
    checker's errors point at its nodes)."""

    model_ir: ir.Model
    graph_module: torch.fx.GraphModule
    options: ExportOptions
    context: DiagnosticContext


def _convert_to_opset(state: OnnxPassState) -> StepResult:
    return StepResult(changed=True, failed=not convert_to_opset(state.model_ir, state.options.opset, state.context))


def _quantize_weights(state: OnnxPassState) -> StepResult:
    config = WeightQuantization.of(state.options.precision)
    assert config is not None
    report = quantize_linear_weights(state.model_ir, config)
    # after the head, whose codes a tied embedding reads
    if config.embedding and not quantize_embeddings(state.model_ir, config):
        raise NotImplementedError(
            "precision: the main graph has no Gather of a float table by input_ids to quantize (the embedding is "
            "computed otherwise, or inside a module function: it is quantized in a flat graph, module_functions=False); "
            "give a WeightQuantization with embedding=False."
        )
    return StepResult(changed=bool(report.quantized), count=len(report.quantized))


def _quantization(state: OnnxPassState) -> WeightQuantization | None:
    return WeightQuantization.of(state.options.precision)


def _pack_projections(state: OnnxPassState) -> int:
    config = _quantization(state)
    assert config is not None
    return pack_projections(state.model_ir, attention_only=not config.packed_projections)


def _quantize_activations(state: OnnxPassState) -> StepResult:
    report = quantize_linears_dynamically(state.model_ir)
    return StepResult(changed=bool(report.quantized), count=len(report.quantized))


ONNX_PASS_STEPS: tuple[Step[OnnxPassState], ...] = (
    # the portable file holds no functions: the library's calls inlined, then typed with the rest
    Step("inline_library_functions", lambda state: inline_library_functions(state.model_ir), stage="legalization",
         when=lambda state: state.options.target == "portable"),
    Step("legalize_types", lambda state: sum(legalize_types(state.model_ir, state.context).changes.values()),
         stage="legalization"),
    Step("optimize", lambda state: optimize_keeping_functions(state.model_ir), stage="optimization",
         when=lambda state: state.options.optimize),
    # the portable target's file is flat: batch norm joins the convolution before it
    Step("fold_batch_norms", lambda state: fold_batch_norms(state.model_ir), stage="optimization",
         when=lambda state: state.options.target == "portable"),
    Step("fold_weight_reads", lambda state: fold_weight_reads(state.model_ir), stage="optimization",
         when=lambda state: state.options.target == "portable" and state.options.optimize),
    # a linear layer's bias of zeros changes no number: one kernel call less a step (the
    # portable file keeps every weight the model has)
    Step("drop_zero_biases", lambda state: drop_zero_biases(state.model_ir), stage="optimization",
         when=lambda state: state.options.target != "portable" and state.options.optimize),
    Step("convert_to_opset", _convert_to_opset, stage="opset conversion"),
    # the opset is final: the kernels join the standard domain
    Step("lower_fused_kernels", lambda state: lower_fused_kernels(state.model_ir)),
    # onnxruntime's kernel for a residual Add and the RMS norm of its sum
    Step("fuse_skip_normalizations", lambda state: fuse_skip_normalizations(state.model_ir),
         when=lambda state: state.options.runtime == "onnxruntime" and state.options.fused_kernels),
    # onnxruntime's kernel where it runs, the exact form elsewhere
    Step("guard_group_query_attention", lambda state: guard_group_query_attention(
        state.model_ir, state.options.context_length or TABLE_POSITIONS)),
    # onnxruntime prepacks a MoE's experts only when they are initializers of the file
    Step("write_expert_weights", lambda state: write_expert_weights(state.model_ir),
         when=lambda state: state.options.runtime == "onnxruntime" and state.options.fused_kernels),
    # after the opset is final: float8 needs 19 or newer
    Step("legalize_float8", lambda state: StepResult(failed=not legalize_float8(state.model_ir, state.context))),
    Step("lay_out_for_tools", lambda state: lay_out_for_tools(state.model_ir), stage="tool layout"),
    # on the weights in MatMul's layout; codes and scales are computed when the model is written
    Step("quantize_weights", _quantize_weights, stage="weight quantization",
         when=lambda state: (q := _quantization(state)) is not None and not q.dynamic_activations),
    # an encoder's int8: activations quantized at run time, the weights' codes computed when written
    Step("quantize_activations_dynamically", _quantize_activations, stage="weight quantization",
         when=lambda state: (q := _quantization(state)) is not None and q.dynamic_activations),
    # after the quantization, on the MatMulNBits it wrote
    # every group on request; otherwise the query, key and value of a GroupQueryAttention,
    # which reads them packed (one kernel call a layer instead of three, and no Split where it runs)
    Step("pack_projections", lambda state: _pack_projections(state), stage="weight quantization",
         when=lambda state: _quantization(state) is not None),
    # float weights: a kernel's query, key and value projections as one MatMul of the
    # joined weights, an initializer of its own (the file stays quantizable by the tools)
    Step("pack_float_projections", lambda state: pack_float_projections(state.model_ir), stage="tool layout",
         when=lambda state: _quantization(state) is None),
    # after the packing: a guarded GroupQueryAttention reads the packed query, key and value
    Step("pack_attention_inputs", lambda state: pack_attention_inputs(state.model_ir), stage="weight quantization"),
    # after every pass that edits the layers' guards: what only their exact branches read
    # (the rotary tables, the expanded mask) computed there, not in every step
    Step("move_into_fallbacks", lambda state: move_into_fallbacks(state.model_ir)),
    # after every pass that edits the layers' guards: one guard for the whole stack, where
    # the weights are quantized (a float file stays as tools that quantize it read it)
    Step("guard_decoder_stack", lambda state: guard_decoder_stack(state.model_ir), stage="weight quantization",
         when=lambda state: _quantization(state) is not None),
    # the portable file keeps its constants as torch.onnx does: initializers, not nodes
    Step("constants_as_initializers", lambda state: constants_as_initializers(state.model_ir), stage="tool layout",
         when=lambda state: state.options.target == "portable"),
    # last before the checker: every pass may add operators ONNX does not know
    Step("type_unknown_op_outputs", lambda state: type_unknown_op_outputs(state.model_ir)),
    Step("validate_model", lambda state: StepResult(failed=not validate_model(state.model_ir, state.graph_module, state.context)),
         stage="validation"),
)


def run_onnx_passes(state: OnnxPassState, timer: StageTimer | None = None) -> list[StepRecord]:
    """The ONNX passes' steps in order on ``state.model_ir``, in place."""
    return run_steps(ONNX_PASS_STEPS, state, state.context, timer)
