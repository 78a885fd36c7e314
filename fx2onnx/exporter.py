"""`dynamo_export`: the stages from a PyTorch model to an ONNXProgram, in order.

capture -> FX passes -> translation -> ONNX passes -> ONNXProgram. Each stage is one
entry whose body is its ordered list of steps (`fx2onnx.steps`); each step is timed
under its stage's name (`ONNXProgram.stage_seconds`). A step that fails stops the
export through one path: its errors are in the diagnostics, which the raised
`OnnxExporterError` lists.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from diagnostics import DiagnosticContext, Level, rules
from diagnostics.checked_fields import check_argument
from dispatcher import OnnxRegistry
from fx2onnx.capture.capture_steps import CaptureState, capture
from fx2onnx.capture.library_adapters import CacheOutsideLayersError, registered_containers
from fx2onnx.capture.fake_mode import outside_fake_mode
from fx2onnx.capture.torch_export import model_name
from fx2onnx.collection_scope import collect_new_objects_only
from fx2onnx.errors import OnnxExporterError
from fx2onnx.fx_passes.fx_pass_steps import FxPassState, run_fx_passes
from fx2onnx.onnx_passes.onnx_pass_steps import OnnxPassState, run_onnx_passes
from fx2onnx.onnx_passes.opset_conversion import check_opset_version
from fx2onnx.options import ExportOptions, WeightQuantization
from fx2onnx.program.onnx_program import ONNXProgram
from fx2onnx.program.program_steps import ProgramState, build_program
from fx2onnx.progress import ExportProgress
from fx2onnx.stage_timer import StageTimer
from fx2onnx.steps import StepFailed
from fx2onnx.translate.translation_steps import TranslationState, translate
from fx2onnx.version import __version__


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
    options = (export_options or ExportOptions()).for_target()
    check_opset_version(options.opset_version)  # a wrong option is refused before any work
    WeightQuantization.of(options.precision)
    context = DiagnosticContext("fx2onnx", __version__, options.diagnostic_options)
    progress = ExportProgress(options.progress, f"Exporting {model_name(model)}")
    timer = StageTimer(on_stage=progress.stage)
    try:
        # outside any fake mode: the export may be called inside `with enable_fake_mode()`
        with outside_fake_mode(), progress.current(), registered_containers(), collect_new_objects_only():
            return _export(model, model_args, model_kwargs, options, context, timer)
    except Exception as error:
        if not isinstance(error, StepFailed) and not context.has_errors():
            # a cache input that cannot be taken apart has a rule of its own; anything else the generic one
            rule, text = ((rules.CACHE_OUTSIDE_LAYERS, f"{error}") if isinstance(error, CacheOutsideLayersError)
                          else (rules.GRAPH_BUILDING, f"Export failed: {type(error).__name__}: {error}"))
            context.record(rule, Level.ERROR, message=text).log_source_exception(error)
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

    captured = CaptureState(model, args, kwargs, options, context)
    capture(captured, timer)

    translation = TranslationState(captured, registry)
    # the passes read the graph's inputs and outputs as the translation describes them
    passes = FxPassState(captured, registry, translation.describe_io)
    run_fx_passes(passes, timer)

    translate(translation, passes.program, passes.graph_module, timer)
    assert translation.model_ir is not None and translation.graph_module is not None
    run_onnx_passes(OnnxPassState(translation.model_ir, translation.graph_module, options, context), timer)
    return build_program(ProgramState(captured, translation, timer))
