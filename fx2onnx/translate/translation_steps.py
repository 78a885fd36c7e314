"""The translation stage as one ordered list of steps, `TRANSLATION_STEPS`, and its
entry `translate`: from the passes' FX graph to an ONNX model on onnx_ir.

Before the FX passes run, the stage describes the graph's inputs and outputs and names
their dims (`TranslationState.describe_io`, which the passes read); then every node that
cannot be translated is reported at once, module calls are grouped when module functions
are asked for (the last FX pass: its problems are reported on the flat graph), the
interpreter translates the graph, and the outputs are registered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx_ir as ir
import torch
import torch.fx

from diagnostics import Level, rules
from dispatcher import OnnxFunctionDispatcher, OnnxRegistry
from fx2onnx.capture.dynamic_dims.names import dim_names_by_position
from fx2onnx.capture.capture_steps import AfterCapture, CaptureState
from fx2onnx.capture.torch_export import model_name
from fx2onnx.fx_passes.modularize import modularize, unmatched_patterns
from fx2onnx.options import ModuleFunctionOptions
from fx2onnx.progress import start_translation
from fx2onnx.stage_timer import StageTimer
from fx2onnx.steps import Step, StepRecord, StepResult, run_steps
from fx2onnx.translate.analysis import report_unsupported_nodes
from fx2onnx.translate.fake_metadata import SymbolNamer
from fx2onnx.translate.graph_builder import GraphBuilder, inference_note
from fx2onnx.translate.graph_io import GraphIO, describe_exported_program, describe_graph_module, input_dim_expressions, name_input_dims
from fx2onnx.translate.interpreter import BodyInitializer, BodyInput, FxOnnxInterpreter
from fx2onnx.translate.io_slots import MUTATION_SUFFIX, MutationOutput, OutputSlot
from fx2onnx.translate.module_functions import ModuleFunctionTranslator
from fx2onnx.translate.values import TracedValue
from fx2onnx.version import __version__


@dataclass
class TranslationState(AfterCapture):
    """What the translation takes (the capture's state, the registry) and what it gives:
    the ONNX model, its inputs' and outputs' slots, the values of the FX nodes."""

    capture: CaptureState
    registry: OnnxRegistry
    namer: SymbolNamer = field(default_factory=SymbolNamer)
    io: GraphIO | None = None
    program: torch.export.ExportedProgram | None = None
    graph_module: torch.fx.GraphModule | None = None
    dispatcher: OnnxFunctionDispatcher | None = None
    unsupported: list[torch.fx.Node] = field(default_factory=list)
    module_translator: ModuleFunctionTranslator | None = None
    env: dict[Any, Any] = field(default_factory=dict)  # FX node -> its ONNX value (op-level debug)
    model_ir: ir.Model | None = None
    output_slots: list[OutputSlot] = field(default_factory=list)
    mutation_outputs: list[MutationOutput] = field(default_factory=list)
    input_dims: list[tuple[Any, ...]] = field(default_factory=list)  # each ONNX input's dims, named
    _builder: GraphBuilder | None = None
    _outputs: tuple[list[Any], Sequence[Any]] = ([], ())

    def describe_io(self, program: torch.export.ExportedProgram | None, graph_module: torch.fx.GraphModule) -> GraphIO:
        """The graph's inputs and outputs (after decomposition), their dims named: the
        user's `Dim` names where the spec gives them."""
        io = describe_exported_program(program) if program is not None else describe_graph_module(graph_module)
        user_names = dim_names_by_position(self.captured.dynamic_shapes_spec, self.model, self.args, self.kwargs, io.in_spec)
        name_input_dims(graph_module, io, self.namer, user_names)
        self.io = io
        return io

    @property
    def function_options(self) -> ModuleFunctionOptions | None:
        return ModuleFunctionOptions.resolve(self.options.module_functions)

    @property
    def graph(self) -> torch.fx.GraphModule:
        assert self.graph_module is not None and self.io is not None, "translate() sets the graph first"
        return self.graph_module


def _report_unsupported_nodes(state: TranslationState) -> StepResult:
    state.dispatcher = OnnxFunctionDispatcher(state.registry, state.context)
    state.unsupported = report_unsupported_nodes(state.graph, state.dispatcher, state.context)
    return StepResult(count=len(state.unsupported))


def _groups_modules(state: TranslationState) -> bool:
    return state.function_options is not None and not state.unsupported


def _tell_unmatched_patterns(state: TranslationState) -> int:
    """A warning per module-function pattern that selects no module call (a misspelt name)."""
    options = state.function_options
    assert options is not None
    unmatched = unmatched_patterns(state.graph, options)
    for option, pattern, classes in unmatched:
        shown = pattern.__qualname__ if isinstance(pattern, type) else repr(pattern)
        state.context.record(
            rules.OPTION_WITHOUT_EFFECT, Level.WARNING, option=f"ModuleFunctionOptions({option}=...) pattern {shown}",
            reason=f"no module call of the model matches it. Its modules' classes: {', '.join(classes) or 'none'}.",
        )
    return len(unmatched)


def _modularize(state: TranslationState) -> StepResult:
    options = state.function_options
    assert options is not None and state.io is not None
    weight_names = {node_name: target for node_name, (target, _) in state.io.lifted_tensors.items()}
    state.graph_module = modularize(state.graph, options, weight_names)
    state.module_translator = ModuleFunctionTranslator(options.share_identical)
    return StepResult(changed=True)


def _translate_graph(state: TranslationState) -> StepResult:
    io, graph_module, context = state.io, state.graph, state.context
    assert io is not None and state.dispatcher is not None
    builder = GraphBuilder(opset_version=state.registry.opset_version, on_inference_failure=inference_note(context))
    interpreter = FxOnnxInterpreter(state.dispatcher, context, state.namer, call_module_handler=state.module_translator)
    weights = {name: BodyInitializer(target, tensor) for name, (target, tensor) in io.lifted_tensors.items()}
    start_translation(graph_module)
    renamed_inputs = {placeholder: BodyInput(name) for placeholder, name in io.input_names.items()}
    with context.scope(rules.FX_GRAPH_TO_ONNX, Level.NONE, graph_name=model_name(state.model)) as graph_diagnostic:
        graph_diagnostic.log_code(lambda: graph_module.print_readable(print_output=False), "python")
        translated = interpreter.translate(graph_module, builder, inputs={**weights, **renamed_inputs}, skip=state.unsupported)
        graph_diagnostic.properties["fx_nodes"] = len(graph_module.graph.nodes)
    state._builder, state._outputs, state.env = builder, (translated.outputs, translated.output_metas), translated.env
    return StepResult(changed=True, failed=context.has_errors())


def _register_outputs(state: TranslationState) -> StepResult:
    assert state._builder is not None and state.io is not None
    state.output_slots, state.mutation_outputs = register_outputs(state._builder, state.io, *state._outputs)
    state.model_ir = state._builder.build_model(__version__)
    state.input_dims = input_dim_expressions(state.graph, state.io, state.namer)
    return StepResult(count=len(state.output_slots))


TRANSLATION_STEPS: tuple[Step[TranslationState], ...] = (
    Step("report_unsupported_nodes", _report_unsupported_nodes, stage="analysis"),
    # Module grouping comes last, after the analysis: problems are reported on the flat graph.
    Step("tell_unmatched_patterns", _tell_unmatched_patterns, when=_groups_modules),
    Step("modularize", _modularize, stage="passes", when=_groups_modules, fx_pass=True, graph=lambda state: state.graph_module),
    Step("translate_graph", _translate_graph, stage="translation"),
    Step("register_outputs", _register_outputs),
)


def translate(
    state: TranslationState,
    program: torch.export.ExportedProgram | None,
    graph_module: torch.fx.GraphModule,
    timer: StageTimer | None = None,
) -> list[StepRecord]:
    """The translation's steps in order on the passes' graph; ``state.model_ir`` is then
    the ONNX model."""
    state.program, state.graph_module = program, graph_module
    return run_steps(TRANSLATION_STEPS, state, state.context, timer)


# torch.export's output kinds of mutated values, and how ONNXProgram.mutation_outputs names them
_MUTATION_KINDS = {"buffer_mutation": "buffer", "user_input_mutation": "user_input"}

_SYMBOLIC_SCALARS = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}


def register_outputs(
    builder: GraphBuilder, io: GraphIO, flat_outputs: list[Any], output_metas: Sequence[Any] = ()
) -> tuple[list[OutputSlot], list[MutationOutput]]:
    """Make every tensor output a distinct graph output; return the user-facing output
    slots and the outputs that carry new values of mutated inputs and buffers."""
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
    return slots, mutations
