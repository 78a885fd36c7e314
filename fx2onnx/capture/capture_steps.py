"""The capture stage as one ordered list of steps, `CAPTURE_STEPS`, and its entry
`capture`: from what the user gave to a graph with FakeTensor metadata.

Tensor defaults of forward become inputs, then the model is captured (`torch_export`:
a given program or GraphModule as it is, else torch.export's attempts in order, see
`capture_strategies.CAPTURE_STRATEGIES`); what survives the capture is frozen for the
collector, and the capture's notes reach the user as warnings.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from diagnostics import DiagnosticContext
from fx2onnx.capture.default_arguments import TensorDefaults, with_tensor_defaults
from fx2onnx.capture.torch_export import CapturedModel, capture_model
from fx2onnx.collection_scope import freeze_survivors
from fx2onnx.options import ExportOptions
from fx2onnx.stage_timer import StageTimer
from fx2onnx.steps import Step, Steps, StepRecord, StepResult, run_steps
from fx2onnx.user_warnings import user_stacklevel


@dataclass
class CaptureState:
    """What the capture takes and gives: the example (its keyword inputs completed with
    forward's tensor defaults) and the captured model."""

    model: Any
    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    options: ExportOptions
    context: DiagnosticContext
    tensor_defaults: TensorDefaults | None = None
    captured: CapturedModel | None = field(default=None)

    @property
    def result(self) -> CapturedModel:
        assert self.captured is not None, "the capture step sets it"
        return self.captured


def _tensor_defaults(state: CaptureState) -> StepResult:
    state.kwargs, state.tensor_defaults = with_tensor_defaults(state.model, state.args, state.kwargs, state.options.fake_context)
    return StepResult(changed=bool(state.tensor_defaults and state.tensor_defaults.defaults))


def _capture(state: CaptureState) -> StepResult:
    options = state.options
    state.captured = capture_model(state.model, state.args, state.kwargs, options.dynamic_shapes, state.context, options.fake_context)
    return StepResult(changed=True, notes=list(state.captured.notes))


def _warn_notes(state: CaptureState) -> int:
    for note in state.result.notes:
        warnings.warn(note, stacklevel=user_stacklevel())
    return len(state.result.notes)


CAPTURE_STEPS: tuple[Step[CaptureState] | Steps[CaptureState], ...] = (
    Steps("capture", (
        Step("tensor_defaults", _tensor_defaults),
        Step("capture_model", _capture),
        # the captured program lives until the export ends
        Step("freeze_survivors", lambda state: freeze_survivors()),
    ), stage="capture"),
    Step("warn_capture_notes", _warn_notes),
)


def capture(state: CaptureState, timer: StageTimer | None = None) -> list[StepRecord]:
    """The capture's steps in order; ``state.result`` is then the captured model and
    ``state.kwargs`` the example's keyword inputs as captured."""
    return run_steps(CAPTURE_STEPS, state, state.context, timer)
