"""Building the ONNXProgram as one ordered list of steps, `PROGRAM_STEPS`, and its entry
`build_program`: the translated, checked model with its input and output adapters, its
signature, op-level debugging and onnxruntime's verification when asked, and the
export's summary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import onnx_ir as ir
import torch

from diagnostics import Level, rules
from fx2onnx.capture.capture_steps import AfterCapture, CaptureState
from fx2onnx.capture.torch_export import model_name
from fx2onnx.program.io_adapter import InputAdapter, OutputAdapter
from fx2onnx.program.model_signature import build_model_signature
from fx2onnx.program.onnx_program import ONNXProgram
from fx2onnx.program.op_level_debug import debug_op_level
from fx2onnx.program.runtime_verification import verify_in_onnxruntime
from fx2onnx.program.tied_sizes import TiedSizes
from fx2onnx.stage_timer import StageTimer
from fx2onnx.steps import Step, StepResult, run_steps
from fx2onnx.translate.translation_steps import TranslationState
from fx2onnx.user_warnings import emit_export_warnings


@dataclass
class ProgramState(AfterCapture):
    """What the program is built from: the capture's state (the model, its example),
    the translation's result, the export's timer; ``program`` is the ONNXProgram once
    built."""

    capture: CaptureState
    translation: TranslationState
    timer: StageTimer
    input_adapter: InputAdapter | None = None
    program: ONNXProgram | None = None

    @property
    def model_ir(self) -> ir.Model:
        assert self.translation.model_ir is not None, "the translation gives the ONNX model"
        return self.translation.model_ir


def _make_input_adapter(state: ProgramState) -> None:
    io = state.translation.io
    assert io is not None
    tied_sizes = TiedSizes.of(state.translation.input_dims)
    state.input_adapter = InputAdapter(io.in_spec, io.input_slots, state.capture.tensor_defaults, tied_sizes)


def _debug_op_level(state: ProgramState) -> Any:
    """Op-level debugging's report (verification reads where a mismatch starts)."""
    translation, io = state.translation, state.translation.io
    assert state.input_adapter is not None and io is not None and translation.graph_module is not None
    return debug_op_level(
        state.model_ir, translation.graph_module, translation.env,
        state.input_adapter.apply(state.args, state.kwargs), io.lifted_tensors, state.context,
    )


def _exported_module(model: Any) -> torch.nn.Module | None:
    return model if isinstance(model, torch.nn.Module) and not isinstance(model, torch.fx.GraphModule) else None


def _make_program(state: ProgramState) -> None:
    translation, io = state.translation, state.translation.io
    assert io is not None
    module = _exported_module(state.model)
    state.program = ONNXProgram(
        state.model_ir,
        state.input_adapter,
        OutputAdapter(io.out_spec, translation.output_slots),
        state.context,
        stage_seconds=state.timer.seconds,
        mutation_outputs=translation.mutation_outputs,
        module=module,
        model_signature=build_model_signature(translation.program, io.input_slots, state.model_ir, translation.mutation_outputs, module),
        fake_context=state.options.fake_context,
    )


def _verify(state: ProgramState) -> StepResult:
    options, program = state.options, state.program
    assert program is not None
    verified = verify_in_onnxruntime(
        program, state.model, state.args, state.kwargs, state.translation.graph_module, state.context,
        lambda: _debug_op_level(state),  # run only for a mismatch: it locates the first node that differs
        options.verify_rtol, options.verify_atol,
    )
    return StepResult(failed=not verified)


def _record_summary(state: ProgramState) -> None:
    assert state.program is not None
    state.program.stage_seconds = dict(state.timer.seconds)  # verification included
    graph = state.model_ir.graph
    times = ", ".join(f"{k} {v:.2f}s" for k, v in state.timer.seconds.items())
    summary = (
        f"{len(graph.inputs)} inputs, {len(graph.outputs)} outputs, {len(graph)} nodes, "
        f"{len(graph.initializers)} initializers, {len(state.model_ir.functions)} functions; {times}. "
        f"{emit_export_warnings(state.context)}"
    )
    state.context.record(rules.EXPORT_SUMMARY, Level.NOTE, model=model_name(state.model), summary=summary)


PROGRAM_STEPS: tuple[Step[ProgramState], ...] = (
    Step("make_input_adapter", _make_input_adapter),
    Step("debug_op_level", _debug_op_level, stage="op_level_debug", when=lambda state: state.options.op_level_debug),
    Step("make_program", _make_program),
    Step("verify_in_onnxruntime", _verify, stage="verification", when=lambda state: state.options.verify),
    Step("record_summary", _record_summary),
)


def build_program(state: ProgramState) -> ONNXProgram:
    """The program-building steps in order; the ONNXProgram they build."""
    run_steps(PROGRAM_STEPS, state, state.context, state.timer)
    assert state.program is not None
    return state.program
