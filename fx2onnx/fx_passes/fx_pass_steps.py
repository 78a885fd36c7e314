"""The FX passes' stage as one ordered list of steps, `FX_PASS_STEPS`, and its entry
`run_fx_passes`: from the captured graph to one the translator can take.

Decomposition first (grad-mode regions inlined, fresh mutations functionalized, the
operators no ONNX function covers decomposed), then the graph's inputs and outputs are
described (by the translation stage, which names them), the captured graph is checked,
and the passes run on the graph and on every branch and body (`on_every_graph`).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.fx

from diagnostics import Level, rules
from dispatcher import OnnxRegistry, record_identity_removed
from fx2onnx.capture.aliased_inputs import report_aliased_inputs
from fx2onnx.capture.dynamic_dims.switches import keep_size_one_dims_dynamic
from fx2onnx.capture.capture_steps import AfterCapture, CaptureState
from fx2onnx.capture.torch_export import copy_graph_module, model_name
from fx2onnx.fx_passes.capture_checks import check_captured_graph
from fx2onnx.fx_passes.decompose_unsupported import (
    decompose_unsupported,
    functionalize_fresh_mutations_of,
    inline_grad_mode_regions,
)
from fx2onnx.fx_passes.effect_tokens import remove_effect_tokens
from fx2onnx.fx_passes.functionalize import functionalize_graph_module
from fx2onnx.fx_passes.fused_kernels import FusionTarget, fuse_kernels
from fx2onnx.fx_passes.node_decompositions import decompose_nodes
from fx2onnx.fx_passes.quantized_weights import keep_quantized_weights
from fx2onnx.fx_passes.remove_assertions import remove_assertions
from fx2onnx.fx_passes.remove_identity_views import remove_identity_views
from fx2onnx.fx_passes.training_mode import report_training_mode
from fx2onnx.fx_passes.type_promotion import insert_type_promotion
from fx2onnx.steps import Step, StepRecord, StepResult, Steps, on_every_graph, run_steps
from fx2onnx.stage_timer import StageTimer
from fx2onnx.user_warnings import user_stacklevel


class InputSlotView(Protocol):
    """What the passes read of one input of the graph (translate's `InputSlot`)."""

    name: str
    is_onnx_input: bool


class GraphInterface(Protocol):
    """What the passes read of the graph's inputs and outputs, described after the
    decomposition by the translation stage (its `GraphIO`)."""

    effect_tokens: set[str]
    output_roles: Sequence[tuple[str, str | None]]
    specialized_scalars: Sequence[tuple[str, Any]]
    input_slots: Sequence[InputSlotView]

    def onnx_input_name(self, placeholder: str) -> str: ...


# (the program or None, the graph to translate) -> its inputs and outputs, described
DescribeIO = Callable[[torch.export.ExportedProgram | None, torch.fx.GraphModule], GraphInterface]


@dataclass
class FxPassState(AfterCapture):
    """What the FX passes take (the capture's state, the registry, how the graph's inputs
    and outputs are described), and the graph they leave for the translation."""

    capture: CaptureState
    registry: OnnxRegistry
    describe_io: DescribeIO
    program: torch.export.ExportedProgram | None = None
    graph_module: torch.fx.GraphModule = field(init=False)
    io: GraphInterface | None = None
    # why the whole program is re-traced instead of decomposed node by node
    whole_program_reasons: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.program = self.captured.exported_program
        self.graph_module = self.program.graph_module if self.program is not None else self.captured.graph_module

    @property
    def interface(self) -> GraphInterface:
        assert self.io is not None, "the graph's inputs and outputs are described before the passes that read them"
        return self.io


def _copy_given_program(state: FxPassState) -> StepResult:
    # The passes edit the graph in place: never edit the user's program.
    state.graph_module = copy_graph_module(state.graph_module)
    return StepResult(changed=True)


def _training_mode(state: FxPassState) -> None:
    report_training_mode(state.graph_module.graph, model_name(state.model), state.context)


def _inline_grad_mode_regions(state: FxPassState) -> StepResult:
    state.whole_program_reasons = inline_grad_mode_regions(state.graph_module)
    return StepResult(notes=state.whole_program_reasons)


def _decompose_unsupported(state: FxPassState) -> StepResult:
    assert state.program is not None
    decomposed = decompose_unsupported(state.program, state.graph_module, state.registry, state.whole_program_reasons)
    state.program, state.graph_module = decomposed.program, decomposed.graph_module
    if decomposed.whole_program_reasons:
        state.context.record(
            rules.FX_PASS,
            Level.NOTE,
            pass_name="decompose_unsupported",
            message="The whole program was re-traced with run_decompositions, because these operators "
            "could not be decomposed node by node: " + "; ".join(decomposed.whole_program_reasons),
        )
    return StepResult(notes=decomposed.whole_program_reasons)


def _functionalize(state: FxPassState) -> StepResult:
    functional = functionalize_graph_module(state.graph_module)
    changed, state.graph_module = functional is not state.graph_module, functional
    return StepResult(changed=changed)


def _describe_io(state: FxPassState) -> None:
    state.io = state.describe_io(state.program, state.graph_module)


def _check_captured_graph(state: FxPassState) -> StepResult:
    return StepResult(failed=not check_captured_graph(state.graph_module, state.interface.output_roles, state.context))


def _report_aliased_inputs(state: FxPassState) -> None:
    # after decomposition: in-place updates of inputs are in the signature
    assert state.program is not None
    report_aliased_inputs(state.context, state.program, state.captured.alias_groups, state.args, state.kwargs)


def _tell_specialized_scalars(state: FxPassState) -> StepResult:
    notes = []
    for name, value in state.interface.specialized_scalars:
        message = (
            f"Input '{name}' is a Python {type(value).__name__} ({value!r}): its value is baked into "
            "the ONNX graph, and the exported model accepts only this value. Pass a tensor to keep it an input."
        )
        state.context.record(rules.GRAPH_BUILDING, Level.NOTE, message=message)
        warnings.warn(message, stacklevel=user_stacklevel())
        notes.append(message)
    return StepResult(notes=notes)


def _causal_mask_placeholder(input_name: str | None, io: GraphInterface) -> str | None:
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


def _fuse_kernels(state: FxPassState) -> int:
    options = state.options
    opset, chosen = options.opset, options.opset_version is not None
    target = FusionTarget(options.runtime, _causal_mask_placeholder(options.causal_mask_input, state.interface),
                          portable=options.target == "portable")
    return on_every_graph(fuse_kernels)(state.graph_module, opset, state.context, chosen, target)


def _pass(name: str, run: Callable[[FxPassState], Any], **kwargs: Any) -> Step[FxPassState]:
    """An FX pass: recorded as FXE0010, its graph's node count logged at DEBUG."""
    return Step(name, run, fx_pass=True, graph=lambda state: state.graph_module, **kwargs)


def _has_program(state: FxPassState) -> bool:
    return state.program is not None


def _decomposition_switches(state: FxPassState) -> Any:
    # retraces must reason as the capture did, or sizes come from the example's 0/1 dims
    return keep_size_one_dims_dynamic(state.captured.size_oblivious)


FX_PASS_STEPS: tuple[Step[FxPassState] | Steps[FxPassState], ...] = (
    Step("copy_given_program", _copy_given_program, when=lambda state: state.program is state.model),
    Step("report_training_mode", _training_mode),
    Steps("decomposition", (
        _pass("inline_grad_mode_regions", _inline_grad_mode_regions, when=_has_program),
        _pass(
            "functionalize_fresh_mutations", lambda state: functionalize_fresh_mutations_of(state.graph_module),
            when=lambda state: _has_program(state) and not state.whole_program_reasons,
        ),
        _pass("decompose_unsupported", _decompose_unsupported, when=_has_program),
    ), stage="decomposition", around=_decomposition_switches),
    Step("functionalize_graph_module", _functionalize, stage="passes", when=lambda state: not _has_program(state)),
    Step("describe_io", _describe_io),
    Step("check_captured_graph", _check_captured_graph, stage="analysis"),
    Step("report_aliased_inputs", _report_aliased_inputs, when=_has_program),
    Step("tell_specialized_scalars", _tell_specialized_scalars),
    # Branches and bodies of control flow are graphs of their own: every pass runs on them.
    Steps("passes", (
        _pass("remove_effect_tokens", lambda state: remove_effect_tokens(state.graph_module, state.interface.effect_tokens)),
        _pass("remove_assertions", lambda state: on_every_graph(remove_assertions)(state.graph_module)),
        _pass("remove_identity_views", lambda state: on_every_graph(remove_identity_views)(
            state.graph_module, on_removed=functools.partial(record_identity_removed, state.context))),
        _pass("decompose_nodes", lambda state: on_every_graph(decompose_nodes)(state.graph_module, state.registry, state.context)),
        _pass("insert_type_promotion", lambda state: on_every_graph(insert_type_promotion)(state.graph_module, state.context)),
        # onnxruntime's MatMulNBits keeps quantized weights quantized
        _pass("keep_quantized_weights", lambda state: on_every_graph(keep_quantized_weights)(state.graph_module, state.context),
              when=lambda state: state.options.runtime == "onnxruntime"),
        _pass("fuse_kernels", _fuse_kernels, when=lambda state: state.options.fused_kernels),
    ), stage="passes"),
)


def run_fx_passes(state: FxPassState, timer: StageTimer | None = None) -> list[StepRecord]:
    """The FX passes' steps in order on ``state``; its graph is then the one to translate."""
    return run_steps(FX_PASS_STEPS, state, state.context, timer)
