"""The capture stage as one ordered list of steps, `CAPTURE_STEPS`, and its entry
`capture`: from what the user gave to a graph with FakeTensor metadata.

Forward's tensor defaults become inputs and fake and real tensors must not mix; a given
ExportedProgram or aten-level GraphModule is taken as it is; else the model (a function
wrapped as a module) is captured by torch.export from an example of its own (aliased
inputs copied), with the dynamic-shapes spec built from the options, through the ordered
attempts of `capture_strategies.CAPTURE_STRATEGIES`. A capture kept is checked (the dims
asked to be dynamic, sizes taken as 1, branches on dynamic sizes); one that failed is
explained. What survives the capture is frozen for the collector, and the capture's
notes reach the user as warnings.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from diagnostics import DiagnosticContext, Level, exception_summary, rules
from fx2onnx.capture.aliased_inputs import IndependentExample, independent_example
from fx2onnx.capture.capture_reports import (
    record_capture_failure,
    record_strict_fallback,
    report_branch_conditions,
    report_sizes_taken_as_one,
)
from fx2onnx.capture.capture_strategies import Captured, CaptureJob, attempt_captures
from fx2onnx.capture.default_arguments import TensorDefaults, with_tensor_defaults
from fx2onnx.capture.dynamic_dims.check import (
    FixedDynamicDimError,
    check_dynamic_dims,
    explain_fixed_dims,
    fixed_dims_text,
    is_fixed_dim_error,
)
from fx2onnx.capture.dynamic_dims.signature import bound_arguments
from fx2onnx.capture.dynamic_dims.size_one import Example
from fx2onnx.capture.dynamic_dims.spec import DynamicDimError, requested_dynamic_dims, torch_export_spec
from fx2onnx.capture.fake_mode import check_fake_mode_use
from fx2onnx.capture.hints import CaptureFailure, capture_hint, explain
from fx2onnx.capture.library_adapters import library_input_notes, static_image_sizes_at_capture
from fx2onnx.capture.torch_export import (
    CapturedModel,
    CaptureError,
    as_module,
    graph_module_as_captured,
    is_aten_graph,
    plain_program,
    run_torch_export,
    user_model,
)
from fx2onnx.collection_scope import freeze_survivors
from fx2onnx.options import ExportOptions
from fx2onnx.stage_timer import StageTimer
from fx2onnx.steps import Step, StepRecord, StepResult, Steps, run_steps
from fx2onnx.user_warnings import user_stacklevel


@dataclass
class CaptureState:
    """What the capture takes and gives: the example as the user gave it (its keyword
    inputs completed with forward's tensor defaults) and the captured model."""

    model: Any
    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    options: ExportOptions
    context: DiagnosticContext
    tensor_defaults: TensorDefaults | None = None
    captured: CapturedModel | None = None
    module: torch.nn.Module | None = None  # the model as torch.export takes it
    independent: IndependentExample | None = None  # the example torch.export gets
    job: CaptureJob | None = None
    kept: Captured | None = None
    spec_notes: list[str] = field(default_factory=list)  # dims the spec keeps static, and why

    @property
    def result(self) -> CapturedModel:
        assert self.captured is not None, "the capture steps set it"
        return self.captured


class AfterCapture:
    """The later stages' states read what the capture took and gave from its state,
    their field `capture`."""

    capture: CaptureState

    @property
    def model(self) -> Any:
        return self.capture.model

    @property
    def args(self) -> Sequence[Any]:
        return self.capture.args

    @property
    def kwargs(self) -> Mapping[str, Any]:
        return self.capture.kwargs

    @property
    def captured(self) -> CapturedModel:
        return self.capture.result

    @property
    def options(self) -> ExportOptions:
        return self.capture.options

    @property
    def context(self) -> DiagnosticContext:
        return self.capture.context


def _fail(state: CaptureState, failure: CaptureFailure, message: str, *others: BaseException, fixed: Sequence[Any] = ()) -> None:
    """The one way the capture fails: recorded at the user's line with its hint."""
    record_capture_failure(state.context, failure, *others, fixed=fixed)
    raise CaptureError(message) from failure.error


def _tensor_defaults(state: CaptureState) -> StepResult:
    state.kwargs, state.tensor_defaults = with_tensor_defaults(state.model, state.args, state.kwargs, state.options.fake_context)
    return StepResult(changed=state.tensor_defaults is not None)


def _check_fake_mode_use(state: CaptureState) -> None:
    try:
        check_fake_mode_use(state.model, state.args, state.kwargs, state.options.fake_context)
    except ValueError as error:  # fake and real tensors mixed: a capture failure with its hint
        failure = CaptureFailure(error, state.model, state.args, state.kwargs)
        _fail(state, failure, f"{error}\nHint: {capture_hint(failure)}")


def _take_given_program(state: CaptureState) -> None:
    program = plain_program(state.model, state.context)
    state.captured = CapturedModel(program.graph_module, program)


def _take_graph_module(state: CaptureState) -> None:
    state.captured = graph_module_as_captured(state.model, state.args, state.kwargs)


def _as_module(state: CaptureState) -> None:
    state.module = as_module(state.model)
    if state.module is None:
        failure = CaptureFailure(TypeError(f"{type(state.model).__name__} is not a model"), state.model, state.args, state.kwargs)
        _fail(state, failure, f"Not a model: {capture_hint(failure)}")


def _dynamic_shapes(state: CaptureState) -> None:
    """The example torch.export gets (aliased inputs: copies of their own), the spec built
    from the option and the dims it asks to be dynamic."""
    module, option = state.module, state.options.dynamic_shapes
    assert module is not None
    state.independent = independent = independent_example(module, state.args, state.kwargs)
    args, kwargs = independent.args, independent.kwargs
    spec = torch_export_spec(option, module, args, kwargs)
    if option is True:  # every dim asked dynamic: a library's model may keep some static
        spec, state.spec_notes = static_image_sizes_at_capture(spec, module, bound_arguments(module, args, kwargs))
        for note in state.spec_notes:
            state.context.record(rules.CAPTURE_FAILURE, Level.NOTE, message=note)
    try:
        requested = requested_dynamic_dims(spec, module, args, kwargs, explicit=option is not True)
    except DynamicDimError as error:
        failure = CaptureFailure(error, user_model(module), args, kwargs, option)
        _fail(state, failure, f"{error}\nHint: {capture_hint(failure)}")
    state.job = CaptureJob(module, Example(tuple(args), dict(kwargs), requested), spec, state.context)


def _attempt_captures(state: CaptureState) -> StepResult:
    assert state.job is not None
    state.kept, refusals = attempt_captures(state.job)
    return StepResult(changed=state.kept is not None, count=len(refusals), notes=[f"{r.strategy}: {r.reason}" for r in refusals])


def _explain_failure(state: CaptureState) -> None:
    """No strategy kept a program: the failure, with the named dims the model fixes."""
    job = state.job
    assert job is not None and state.module is not None
    module, errors, example, option = job.model, job.errors, job.example, state.options.dynamic_shapes
    failure = CaptureFailure(errors[0], user_model(module), example.args, example.kwargs, option)
    fixed = []
    if len(example.requested) and any(is_fixed_dim_error(error) for error in errors):
        recapture = lambda relaxed: run_torch_export(module, example.args, example.kwargs, relaxed, False, False)  # noqa: E731
        fixed = explain_fixed_dims(state.context, recapture, job.spec, example.requested, example.args, example.kwargs)
    if fixed:
        message = f"{fixed_dims_text(fixed)}\n{explain(errors[0])}\nHint: {capture_hint(failure)}"
    else:
        message = (
            "torch.export could not capture the model.\n"
            f"  non-strict: {exception_summary(errors[0])}\n"
            f"  strict:     {exception_summary(errors[-1])}\n"
            f"Hint: {capture_hint(failure)}"
        )
    _fail(state, failure, message, *errors[1:], fixed=fixed)


def _check_kept_capture(state: CaptureState) -> StepResult:
    """The capture kept, its dynamic dims checked against what was asked."""
    kept, job, context = state.kept, state.job, state.context
    assert kept is not None and job is not None and state.independent is not None
    program = plain_program(kept.program, context)
    captured = CapturedModel(
        program.graph_module, program, job.spec, size_oblivious=kept.size_oblivious, alias_groups=state.independent.groups
    )
    if kept.strict and job.errors:
        captured.notes.append(record_strict_fallback(context, job.errors[0]))
    used = kept.example
    try:
        captured.notes += check_dynamic_dims(context, program, used.requested, used.args, used.kwargs)
    except FixedDynamicDimError as error:
        raise CaptureError(str(error)) from error
    captured.notes += report_sizes_taken_as_one(context, program)
    captured.notes += report_branch_conditions(context, program, used)
    captured.notes += library_input_notes(used.args, used.kwargs)
    captured.notes += state.spec_notes
    state.captured = captured
    return StepResult(notes=list(captured.notes))


def _warn_notes(state: CaptureState) -> int:
    for note in state.result.notes:
        warnings.warn(note, stacklevel=user_stacklevel())
    return len(state.result.notes)


def _not_captured(state: CaptureState) -> bool:
    return state.captured is None


def _torch_export_ran(state: CaptureState) -> bool:
    return state.job is not None


CAPTURE_STEPS: tuple[Step[CaptureState] | Steps[CaptureState], ...] = (
    Steps("capture", (
        Step("tensor_defaults", _tensor_defaults),
        Step("check_fake_mode_use", _check_fake_mode_use),
        Step("take_given_program", _take_given_program,
             when=lambda state: isinstance(state.model, torch.export.ExportedProgram)),
        Step("take_aten_graph_module", _take_graph_module,
             when=lambda state: _not_captured(state) and isinstance(state.model, torch.fx.GraphModule) and is_aten_graph(state.model)),
        Step("as_module", _as_module, when=_not_captured),
        Step("dynamic_shapes", _dynamic_shapes, when=_not_captured),
        Step("attempt_captures", _attempt_captures, when=_not_captured),
        Step("explain_failure", _explain_failure, when=lambda state: _torch_export_ran(state) and state.kept is None),
        Step("check_kept_capture", _check_kept_capture, when=lambda state: _not_captured(state) and state.kept is not None),
        # the captured program lives until the export ends
        Step("freeze_survivors", lambda state: freeze_survivors()),
    ), stage="capture"),
    Step("warn_capture_notes", _warn_notes),
)


def capture(state: CaptureState, timer: StageTimer | None = None) -> list[StepRecord]:
    """The capture's steps in order; ``state.result`` is then the captured model and
    ``state.kwargs`` the example's keyword inputs as captured."""
    return run_steps(CAPTURE_STEPS, state, state.context, timer)
