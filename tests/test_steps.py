"""The one step runner: steps run in their order, skipped when they do not apply, nested
lists under one timer and switch, FX passes recorded as FXE0010, the first failing step
stops the run; every stage's entry is an ordered list of such steps."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

import pytest
import torch

from diagnostics import DiagnosticContext, DiagnosticOptions, Level, rules
from fx2onnx.stage_timer import StageTimer
from fx2onnx.steps import Step, StepFailed, StepResult, Steps, on_every_graph, run_steps


@dataclass
class _State:
    ran: list[str] = field(default_factory=list)
    graph_module: torch.fx.GraphModule | None = None
    switched: bool = False


def _context(verbosity: int = logging.INFO) -> DiagnosticContext:
    return DiagnosticContext("fx2onnx", "0.1.0", DiagnosticOptions(verbosity_level=verbosity))


def _step(name: str, result: object = None, **kwargs: object) -> Step[_State]:
    def run(state: _State) -> object:
        state.ran.append(name + ("+switch" if state.switched else ""))
        return result

    return Step(name, run, **kwargs)


def test_steps_run_in_order_and_skip_those_that_do_not_apply() -> None:
    @contextlib.contextmanager
    def switch(state: _State):
        state.switched = True
        yield
        state.switched = False

    steps = (
        _step("a", 2, stage="first"),
        _step("b", when=lambda state: False),
        Steps("group", (_step("c", True), _step("d")), stage="second", around=switch),
        _step("e", stage="first"),
    )
    state, timer = _State(), StageTimer()
    records = run_steps(steps, state, _context(), timer)
    assert state.ran == ["a", "c+switch", "d+switch", "e"]
    assert [(r.name, r.result.changed, r.result.count) for r in records] == [
        ("a", True, 2), ("c", True, 0), ("d", False, 0), ("e", False, 0)
    ]
    assert list(timer.seconds) == ["first", "second"]


def test_the_first_failing_step_stops_the_run_and_names_itself() -> None:
    state = _State()
    steps = (_step("check", StepResult(failed=True)), _step("after"))
    with pytest.raises(StepFailed, match="'check'") as raised:
        run_steps(steps, state, _context())
    assert raised.value.step == "check" and state.ran == ["check"]


def _two_adds() -> torch.fx.GraphModule:
    class TwoAdds(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1 + 2

    return torch.fx.symbolic_trace(TwoAdds())


def test_fx_passes_are_recorded_as_fxe0010_with_their_node_counts_at_debug() -> None:
    state = _State(graph_module=_two_adds())

    def drop_last_add(state: _State) -> int:
        graph = state.graph_module.graph
        last = [node for node in graph.nodes if node.op == "call_function"][-1]
        last.replace_all_uses_with(last.args[0])
        graph.erase_node(last)
        return 1

    context = _context(logging.DEBUG)
    steps = (
        Step("drop_last_add", drop_last_add, fx_pass=True, graph=lambda state: state.graph_module),
        _step("not_a_pass"),
    )
    run_steps(steps, state, context)
    (diagnostic,) = [d for d in context.diagnostics if d.rule is rules.FX_PASS]
    assert diagnostic.level == Level.NONE and diagnostic.properties["seconds"] >= 0
    assert "drop_last_add" in diagnostic.message
    assert "FX nodes: 4 before, 3 after." in diagnostic.markdown()


def test_on_every_graph_runs_a_pass_on_the_graph_and_sums_its_counts() -> None:
    seen = []

    def count_adds(graph_module: torch.fx.GraphModule) -> int:
        seen.append(graph_module)
        return sum(node.op == "call_function" for node in graph_module.graph.nodes)

    graph_module = _two_adds()
    assert on_every_graph(count_adds)(graph_module) == 2
    assert seen == [graph_module]
    assert on_every_graph(count_adds).__name__ == "count_adds"


def test_every_stage_is_one_ordered_list_of_steps() -> None:
    from fx2onnx.capture.capture_steps import CAPTURE_STEPS
    from fx2onnx.fx_passes.fx_pass_steps import FX_PASS_STEPS
    from fx2onnx.onnx_passes.onnx_pass_steps import ONNX_PASS_STEPS
    from fx2onnx.program.program_steps import PROGRAM_STEPS
    from fx2onnx.translate.translation_steps import TRANSLATION_STEPS

    def names(steps: tuple) -> list[str]:
        return [name for step in steps for name in (names(step.steps) if isinstance(step, Steps) else [step.name])]

    # the passes that ran hidden inside the decomposition are steps of their own
    assert names(FX_PASS_STEPS)[2:5] == ["inline_grad_mode_regions", "functionalize_fresh_mutations", "decompose_unsupported"]
    assert names(FX_PASS_STEPS).index("describe_io") < names(FX_PASS_STEPS).index("check_captured_graph")
    assert names(CAPTURE_STEPS).index("attempt_captures") < names(CAPTURE_STEPS).index("check_kept_capture")
    assert names(TRANSLATION_STEPS) == [
        "report_unsupported_nodes", "tell_unmatched_patterns", "modularize", "translate_graph", "register_outputs"
    ]
    assert names(ONNX_PASS_STEPS)[:2] == ["inline_library_functions", "legalize_types"]
    assert names(ONNX_PASS_STEPS)[-1] == "validate_model"
    assert names(PROGRAM_STEPS)[-1] == "record_summary"
