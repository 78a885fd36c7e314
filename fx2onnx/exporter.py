"""`dynamo_export`: the stages from a PyTorch model to an ONNXProgram, in order.

capture -> decompose -> FX passes -> analysis -> translation -> ONNXProgram.
Each stage is timed on its own (`ONNXProgram.stage_seconds`).
"""

from __future__ import annotations

import functools

import logging
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import onnx_ir as ir
import torch

from diagnostics import DiagnosticContext, Level, rules
from diagnostics.checked_fields import check_argument
from dispatcher import OnnxFunctionDispatcher, OnnxRegistry, record_identity_removed
from fx2onnx.translate.analysis import report_unsupported_nodes
from fx2onnx.capture.aliased_inputs import report_aliased_inputs
from fx2onnx.capture.torch_export import CaptureError, capture, copy_graph_module, model_name
from fx2onnx.fx_passes.capture_checks import check_captured_graph
from fx2onnx.collection_scope import collect_new_objects_only, freeze_survivors
from fx2onnx.capture.library_adapters import registered_containers
from fx2onnx.translate.control_flow import on_every_graph
from fx2onnx.fx_passes.decompose import decompose_unsupported
from fx2onnx.capture.dynamic_dims.names import dim_names_by_position
from fx2onnx.capture.dynamic_dims.spec import keep_size_one_dims_dynamic
from fx2onnx.errors import OnnxExporterError
from fx2onnx.version import __version__
from fx2onnx.translate.fake_metadata import SymbolNamer
from fx2onnx.capture.default_arguments import with_tensor_defaults
from fx2onnx.capture.fake_mode import outside_fake_mode
from fx2onnx.translate.graph_builder import GraphBuilder, inference_note
from fx2onnx.translate.graph_io import GraphIO, describe_exported_program, describe_graph_module, input_dim_expressions, name_input_dims
from fx2onnx.translate.interpreter import BodyInitializer, BodyInput, FxOnnxInterpreter
from fx2onnx.onnx_passes.legalize_types import legalize_types
from fx2onnx.program.io_adapter import InputAdapter, OutputAdapter
from fx2onnx.program.tied_sizes import TiedSizes
from fx2onnx.translate.io_slots import MUTATION_SUFFIX, MutationOutput, OutputSlot
from fx2onnx.program.model_signature import build_model_signature
from fx2onnx.translate.module_functions import ModuleFunctionTranslator
from fx2onnx.onnx_passes.float8 import legalize_float8
from fx2onnx.onnx_passes.cached_attention_guard import guard_group_query_attention
from fx2onnx.onnx_passes.fused_kernel_domain import lower_fused_kernels
from fx2onnx.onnx_passes.opset_conversion import check_opset_version, convert_to_opset
from fx2onnx.onnx_passes.optimization import optimize_keeping_functions
from fx2onnx.fx_passes.quantized_weights import keep_quantized_weights
from fx2onnx.onnx_passes.tool_layout import lay_out_for_tools
from fx2onnx.program.op_level_debug import debug_op_level
from fx2onnx.options import ExportOptions, ModuleFunctionOptions
from fx2onnx.fx_passes.modularize import modularize, unmatched_patterns
from fx2onnx.fx_passes.decompose_nodes import decompose_nodes
from fx2onnx.fx_passes.effect_tokens import remove_effect_tokens
from fx2onnx.fx_passes.functionalize import functionalize_graph_module
from fx2onnx.fx_passes.fused_kernels import FusionTarget, fuse_kernels
from fx2onnx.fx_passes.remove_assertions import remove_assertions
from fx2onnx.fx_passes.training_mode import report_training_mode
from fx2onnx.fx_passes.remove_identity_views import remove_identity_views
from fx2onnx.fx_passes.type_promotion import insert_type_promotion
from fx2onnx.program.onnx_program import ONNXProgram
from fx2onnx.progress import ExportProgress, start_translation
from fx2onnx.program.runtime_verification import verify_in_onnxruntime
from fx2onnx.stage_timer import StageTimer
from fx2onnx.user_warnings import emit_export_warnings
from fx2onnx.onnx_passes.validate_model import validate_model
from fx2onnx.translate.values import TracedValue


class _ExportFailed(Exception):
    """Internal: errors were recorded as diagnostics; stop and report them."""


def dynamo_export(
    model: torch.nn.Module | torch.export.ExportedProgram | torch.fx.GraphModule | Any,
    /,
    *model_args: Any,
    export_options: ExportOptions | None = None,
    **model_kwargs: Any,
) -> ONNXProgram:
    """Export a PyTorch model to ONNX.

    Args:
        model: an `nn.Module` (captured with torch.export), a plain Python function of
            tensors (its inputs named after its parameters, its problems reported at its
            lines), an `ExportedProgram` (taken as it is) or an aten-level
            `torch.fx.GraphModule`.
        *model_args: example positional inputs; may be nested and contain None.
        export_options: dynamic shapes, registry, diagnostics; see `ExportOptions`.
        **model_kwargs: example keyword inputs; may be nested and contain None.

    Returns:
        The `ONNXProgram`. On failure an `OnnxExporterError` is raised that lists every
        problem found with the user's source lines, and a SARIF report is written.
    """
    check_argument("dynamo_export", "export_options", export_options, ExportOptions | None)
    options = export_options or ExportOptions()
    check_opset_version(options.opset_version)  # a wrong option is refused before any work
    context = DiagnosticContext("fx2onnx", __version__, options.diagnostic_options)
    progress = ExportProgress(options.progress, f"Exporting {model_name(model)}")
    timer = StageTimer(on_stage=progress.stage)
    try:
        # outside any fake mode: the export may be called inside `with enable_fake_mode()`
        with outside_fake_mode(), progress.current(), registered_containers(), collect_new_objects_only():
            return _export(model, model_args, model_kwargs, options, context, timer)
    except Exception as error:
        if not isinstance(error, (_ExportFailed, CaptureError)) and not context.has_errors():
            context.record(
                rules.GRAPH_BUILDING,
                Level.ERROR,
                message=f"Export failed: {type(error).__name__}: {error}",
            ).log_source_exception(error)
        _record_failure_summary(context, model, timer)
        program = ONNXProgram(None, None, None, context, export_exception=error, stage_seconds=timer.seconds)
        raise OnnxExporterError(program, _failure_message(context, options)) from error


def _record_failure_summary(context: DiagnosticContext, model: Any, timer: StageTimer) -> None:
    """The one summary note of a failed export: how many problems, how far it got."""
    errors, warnings_ = len(context.errors()), len(context.warnings())
    times = ", ".join(f"{k} {v:.2f}s" for k, v in timer.seconds.items())
    context.record(
        rules.EXPORT_SUMMARY,
        Level.NOTE,
        message=(
            f"Exporting {model_name(model)} to ONNX failed with {errors} error(s) and "
            f"{warnings_} warning(s); stages run: {times or 'none'}."
        ),
    )


def _failure_message(context: DiagnosticContext, options: ExportOptions) -> str:
    message = "Failed to export the model to ONNX.\n" + context.summary_text()
    if options.failure_report_path is not None:
        path = os.fspath(options.failure_report_path)
        try:
            context.dump(path)
            message += f"\nThe SARIF report is at '{os.path.abspath(path)}'."
        except (OSError, ValueError) as error:
            message += f"\nThe SARIF report could not be written to '{path}': {error}"
    return message


def _export(
    model: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    options: ExportOptions,
    context: DiagnosticContext,
    timer: StageTimer,
) -> ONNXProgram:
    with timer.stage("registry"):
        registry = options.onnx_registry or OnnxRegistry()
        registry.all_registered_ops()  # torchlib loads once per process: its own stage
    with timer.stage("capture"):
        kwargs, tensor_defaults = with_tensor_defaults(model, args, kwargs, options.fake_context)
        captured = capture(model, args, kwargs, options.dynamic_shapes, context, options.fake_context)
        freeze_survivors()  # the captured program lives until the export ends
    for note in captured.notes:
        warnings.warn(note, stacklevel=3)

    program = captured.exported_program
    graph_module = program.graph_module if program is not None else captured.graph_module
    if program is model:
        # The passes below edit the graph in place: never edit the user's program.
        graph_module = copy_graph_module(graph_module)
    report_training_mode(graph_module.graph, model_name(model), context)
    with timer.stage("decomposition"), keep_size_one_dims_dynamic(captured.size_oblivious):
        if program is not None:
            decomposed = run_pass(context, "decompose_unsupported", decompose_unsupported, program, graph_module, registry)
            program, graph_module = decomposed.program, decomposed.graph_module
            _tell_whole_program_decomposition(decomposed.whole_program_reasons, context)
    if program is None:
        with timer.stage("passes"):
            graph_module = functionalize_graph_module(graph_module)
    io = describe_exported_program(program) if program is not None else describe_graph_module(graph_module)
    with timer.stage("analysis"):
        captured_graph_valid = check_captured_graph(graph_module, io.output_roles, context)
    if not captured_graph_valid:
        raise _ExportFailed()
    if program is not None:  # after decomposition: in-place updates of inputs are in the signature
        report_aliased_inputs(context, program, captured.alias_groups, args, kwargs)
    _tell_specialized_scalars(io, context)

    namer = SymbolNamer()
    name_input_dims(graph_module, io, namer, dim_names_by_position(captured.dynamic_shapes_spec, model, args, kwargs, io.in_spec))

    with timer.stage("passes"):
        run_pass(context, "remove_effect_tokens", remove_effect_tokens, graph_module, io.effect_tokens)
        # Branches and bodies of control flow are graphs of their own: every pass runs on them.
        run_pass(context, "remove_assertions", on_every_graph(remove_assertions), graph_module)
        run_pass(
            context, "remove_identity_views", on_every_graph(remove_identity_views), graph_module,
            on_removed=functools.partial(record_identity_removed, context),
        )
        run_pass(context, "decompose_nodes", on_every_graph(decompose_nodes), graph_module, registry, context)
        run_pass(context, "insert_type_promotion", on_every_graph(insert_type_promotion), graph_module, context)
        if options.runtime == "onnxruntime":  # its MatMulNBits keeps quantized weights quantized
            run_pass(context, "keep_quantized_weights", on_every_graph(keep_quantized_weights), graph_module, context)
        if options.fused_kernels:
            opset, chosen = options.opset_version or registry.opset_version, options.opset_version is not None
            target = FusionTarget(options.runtime, _causal_mask_placeholder(options.causal_mask_input, io))
            run_pass(context, "fuse_kernels", on_every_graph(fuse_kernels), graph_module, opset, context, chosen, target)

    dispatcher = OnnxFunctionDispatcher(registry, context)
    with timer.stage("analysis"):
        unsupported = report_unsupported_nodes(graph_module, dispatcher, context)

    function_options = ModuleFunctionOptions.resolve(options.module_functions)
    module_translator = None
    if function_options is not None and not unsupported:
        # Last pass, after the analysis: problems are reported on the flat graph.
        _tell_unmatched_patterns(graph_module, function_options, context)
        with timer.stage("passes"):
            weight_names = {node_name: target for node_name, (target, _) in io.lifted_tensors.items()}
            graph_module = run_pass(context, "modularize", modularize, graph_module, function_options, weight_names)
        module_translator = ModuleFunctionTranslator(function_options.share_identical)

    builder = GraphBuilder(opset_version=registry.opset_version, on_inference_failure=inference_note(context))
    interpreter = FxOnnxInterpreter(dispatcher, context, namer, call_module_handler=module_translator)
    weights = {name: BodyInitializer(target, tensor) for name, (target, tensor) in io.lifted_tensors.items()}
    start_translation(graph_module)
    renamed_inputs = {placeholder: BodyInput(name) for placeholder, name in io.input_names.items()}
    with timer.stage("translation"), context.scope(
        rules.FX_GRAPH_TO_ONNX, Level.NONE, graph_name=model_name(model)
    ) as graph_diagnostic:
        graph_diagnostic.log_code(lambda: graph_module.print_readable(print_output=False), "python")
        translated = interpreter.translate(graph_module, builder, inputs={**weights, **renamed_inputs}, skip=unsupported)
        graph_diagnostic.properties["fx_nodes"] = len(graph_module.graph.nodes)
    if context.has_errors():
        raise _ExportFailed()

    output_adapter, mutation_outputs = _register_outputs(builder, io, translated.outputs, translated.output_metas)
    model_ir = builder.build_model(__version__)
    tied_sizes = TiedSizes.of(input_dim_expressions(graph_module, io, namer))
    input_adapter = InputAdapter(io.in_spec, io.input_slots, tensor_defaults, tied_sizes)
    with timer.stage("legalization"):
        legalize_types(model_ir, context)
    if options.optimize:
        with timer.stage("optimization"):
            optimize_keeping_functions(model_ir)
    if options.opset_version is not None:
        with timer.stage("opset conversion"):
            if not convert_to_opset(model_ir, options.opset_version, context):
                raise _ExportFailed()
    lower_fused_kernels(model_ir)  # the opset is final: the kernels join the standard domain
    guard_group_query_attention(model_ir)  # onnxruntime's kernel where it runs, the exact form elsewhere
    if not legalize_float8(model_ir, context, opset_chosen=options.opset_version is not None):  # float8 needs 19 or newer
        raise _ExportFailed()
    with timer.stage("tool layout"):
        lay_out_for_tools(model_ir)
    with timer.stage("validation"):
        if not validate_model(model_ir, graph_module, context):
            raise _ExportFailed()
    if options.op_level_debug:
        with timer.stage("op_level_debug"):
            debug_op_level(
                model_ir, graph_module, translated.env,
                input_adapter.apply(args, kwargs), io.lifted_tensors, context,
            )
    exported_module = model if isinstance(model, torch.nn.Module) and not isinstance(model, torch.fx.GraphModule) else None
    onnx_program = ONNXProgram(
        model_ir,
        input_adapter,
        output_adapter,
        context,
        stage_seconds=timer.seconds,
        mutation_outputs=mutation_outputs,
        module=exported_module,
        model_signature=build_model_signature(program, io.input_slots, model_ir, mutation_outputs, exported_module),
        fake_context=options.fake_context,
    )
    if options.verify:
        with timer.stage("verification"):
            locate = lambda: debug_op_level(  # noqa: E731 - run only for a mismatch
                model_ir, graph_module, translated.env, input_adapter.apply(args, kwargs), io.lifted_tensors, context
            )
            verified = verify_in_onnxruntime(
                onnx_program, model, args, kwargs, graph_module, context, locate, options.verify_rtol, options.verify_atol
            )
        onnx_program.stage_seconds = dict(timer.seconds)
        if not verified:
            raise _ExportFailed()
    _record_summary(context, model, model_ir, timer, emit_export_warnings(context))
    return onnx_program


def run_pass(context: DiagnosticContext, name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run one FX pass ``fn(*args, **kwargs)`` as a diagnostic scope (FXE0010, level none).

    The diagnostic records the pass's time; at logging.DEBUG verbosity its log also holds
    the node count of the graph before and after. An exception makes it an error and
    propagates.
    """
    with context.scope(rules.FX_PASS, Level.NONE, pass_name=name) as diagnostic:
        graph = _graph_of(args[0]) if args else None
        before = len(graph.nodes) if graph is not None and diagnostic.would_log(logging.DEBUG) else None
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        seconds = time.perf_counter() - start
        diagnostic.properties["seconds"] = round(seconds, 6)
        diagnostic.log(f"`{name}` took {seconds:.4f} s.", logging.INFO)
        after_graph = _graph_of(result) or graph
        if before is not None and after_graph is not None:
            diagnostic.log(f"FX nodes: {before} before, {len(after_graph.nodes)} after.")
    return result


def _graph_of(value: Any) -> torch.fx.Graph | None:
    if isinstance(value, torch.fx.GraphModule):
        return value.graph
    if isinstance(value, torch.export.ExportedProgram):
        return value.graph_module.graph
    return None


def _tell_whole_program_decomposition(reasons: list[str], context: DiagnosticContext) -> None:
    if reasons:
        context.record(
            rules.FX_PASS,
            Level.NOTE,
            pass_name="decompose_unsupported",
            message="The whole program was re-traced with run_decompositions, because these operators "
            "could not be decomposed node by node: " + "; ".join(reasons),
        )


def _causal_mask_placeholder(input_name: str | None, io: GraphIO) -> str | None:
    """The graph placeholder of the model input ``ExportOptions.causal_mask_input`` names."""
    if input_name is None:
        return None
    user_inputs = {io.onnx_input_name(slot.name): slot.name for slot in io.input_slots if slot.is_onnx_input}
    if input_name not in user_inputs:
        raise ValueError(
            f"ExportOptions(causal_mask_input={input_name!r}) names no input of the model: give one of "
            f"{', '.join(map(repr, user_inputs))}, or None."
        )
    return user_inputs[input_name]


def _tell_unmatched_patterns(graph_module: torch.fx.GraphModule, options: ModuleFunctionOptions, context: DiagnosticContext) -> None:
    """A warning per module-function pattern that selects no module call (a misspelt name)."""
    for option, pattern, classes in unmatched_patterns(graph_module, options):
        shown = pattern.__qualname__ if isinstance(pattern, type) else repr(pattern)
        context.record(
            rules.OPTION_WITHOUT_EFFECT, Level.WARNING, option=f"ModuleFunctionOptions({option}=...) pattern {shown}",
            reason=f"no module call of the model matches it. Its modules' classes: {', '.join(classes) or 'none'}.",
        )


def _tell_specialized_scalars(io: GraphIO, context: DiagnosticContext) -> None:
    for name, value in io.specialized_scalars:
        message = (
            f"Input '{name}' is a Python {type(value).__name__} ({value!r}): its value is baked into "
            "the ONNX graph, and the exported model accepts only this value. Pass a tensor to keep it an input."
        )
        context.record(rules.GRAPH_BUILDING, Level.NOTE, message=message)
        warnings.warn(message, stacklevel=4)


# torch.export's output kinds of mutated values, and how ONNXProgram.mutation_outputs names them
_MUTATION_KINDS = {"buffer_mutation": "buffer", "user_input_mutation": "user_input"}


_SYMBOLIC_SCALARS = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}


def _register_outputs(
    builder: GraphBuilder, io: GraphIO, flat_outputs: list[Any], output_metas: Sequence[Any] = ()
) -> tuple[OutputAdapter, list[MutationOutput]]:
    """Make every tensor output a distinct graph output; return the user-facing adapter
    and the outputs that carry new values of mutated inputs and buffers."""
    graph_values = iter(builder.set_outputs([value for value in flat_outputs if isinstance(value, ir.Value)]))
    slots: list[OutputSlot] = []
    mutations: list[MutationOutput] = []
    index = 0
    user_names = iter(io.output_names)
    for position, value in enumerate(flat_outputs):
        role, target = io.output_roles[position] if position < len(io.output_roles) else ("user", None)
        user_name = next(user_names, None) if role == "user" else None
        if not isinstance(value, ir.Value):
            if role == "user":
                slots.append(OutputSlot(None, constant=value))
            continue
        value = next(graph_values)
        if target is not None and role in _MUTATION_KINDS:
            onnx_target = io.onnx_input_name(target) if role == "user_input_mutation" else target
            value.name = builder.unique_name(f"{onnx_target}{MUTATION_SUFFIX}")
            mutations.append(MutationOutput(_MUTATION_KINDS[role], target, value.name, index))
        elif target is not None and role != "user":
            value.name = builder.unique_name(f"{target}")
        if user_name is not None:
            value.name = builder.unique_name(user_name)
        if role == "user":
            meta = output_metas[position] if position < len(output_metas) else None
            slots.append(
                OutputSlot(
                    index,
                    is_complex=isinstance(value, TracedValue) and value.is_complex,
                    python_type=_SYMBOLIC_SCALARS.get(type(meta)),
                )
            )
        index += 1
    return OutputAdapter(io.out_spec, slots), mutations


def _record_summary(context: DiagnosticContext, model: Any, model_ir: ir.Model, timer: StageTimer, warnings_line: str) -> None:
    graph = model_ir.graph
    times = ", ".join(f"{k} {v:.2f}s" for k, v in timer.seconds.items())
    summary = (
        f"{len(graph.inputs)} inputs, {len(graph.outputs)} outputs, {len(graph)} nodes, "
        f"{len(graph.initializers)} initializers, {len(model_ir.functions)} functions; {times}. {warnings_line}"
    )
    context.record(rules.EXPORT_SUMMARY, Level.NOTE, model=model_name(model), summary=summary)
