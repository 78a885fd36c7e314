"""The shape every stage's steps share, and the one runner that runs them in order.

A stage's entry (`capture`, `run_fx_passes`, `translate`, `run_onnx_passes`,
`build_program`) is its ordered list of `Step`s run by `run_steps` on the stage's state
(a dataclass of its own). A step names itself, reads and edits that state, and returns
what it changed (`StepResult`; an int count or a bool is read as one). The runner times
each step under its stage's `StageTimer` name, records each FX pass as its diagnostic
(FXE0010) and stops the export, the one failure path, when a step fails.
`on_every_graph` makes a graph pass a step on every branch and body as well.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch
import torch.fx

from diagnostics import DiagnosticContext, Level, rules
from dispatcher.fx_nodes import graph_modules
from fx2onnx.stage_timer import StageTimer

State = TypeVar("State")


class StepFailed(Exception):
    """Errors were recorded as diagnostics by a step: the export stops and reports them."""

    def __init__(self, message: str = "", step: str | None = None) -> None:
        super().__init__(message or f"the export stopped at step '{step}'; its diagnostics say why")
        self.step = step


@dataclass
class StepResult:
    """What a step did: whether it changed anything, how many things, notes for the
    log, and whether it failed (its errors are in the diagnostics)."""

    changed: bool = False
    count: int = 0
    notes: list[str] = field(default_factory=list)
    failed: bool = False

    @classmethod
    def of(cls, value: Any) -> StepResult:
        """A step's return value read as a result: a count, a changed flag, or nothing."""
        if isinstance(value, StepResult):
            return value
        if isinstance(value, bool):
            return cls(changed=value)
        if isinstance(value, int):
            return cls(changed=value > 0, count=value)
        return cls()


def _always(_: Any) -> bool:
    return True


@dataclass(frozen=True)
class Step(Generic[State]):
    """One step of a stage: `run(state)` when `when(state)` holds, timed as `stage`;
    `fx_pass` steps are recorded as FXE0010 diagnostics, with the node counts of
    `graph(state)` before and after at logging.DEBUG."""

    name: str
    run: Callable[[State], Any]
    stage: str | None = None
    when: Callable[[State], bool] = _always
    fx_pass: bool = False
    graph: Callable[[State], torch.fx.GraphModule | None] | None = None


@dataclass(frozen=True)
class Steps(Generic[State]):
    """A nested list of steps, timed as one `stage` and run inside `around(state)` (a
    switch the whole group needs), when `when(state)` holds."""

    name: str
    steps: Sequence[Step[State] | Steps[State]]
    stage: str | None = None
    when: Callable[[State], bool] = _always
    around: Callable[[State], contextlib.AbstractContextManager[Any]] | None = None


@dataclass(frozen=True)
class StepRecord:
    """A step that ran, and its result."""

    name: str
    result: StepResult


def run_steps(
    steps: Sequence[Step[State] | Steps[State]],
    state: State,
    context: DiagnosticContext,
    timer: StageTimer | None = None,
) -> list[StepRecord]:
    """Run ``steps`` in order on ``state`` (nested lists included); raise `StepFailed` at
    the first that fails.

    A step that raises makes its FXE0010 diagnostic an error (for FX passes) and the
    exception propagates to the exporter, which records it."""
    records: list[StepRecord] = []
    for step in steps:
        if not step.when(state):
            continue
        timed = timer.stage(step.stage) if timer is not None and step.stage else contextlib.nullcontext()
        with timed:
            if isinstance(step, Steps):
                with step.around(state) if step.around is not None else contextlib.nullcontext():
                    records += run_steps(step.steps, state, context, timer)
                continue
            result = _run_fx_pass(step, state, context) if step.fx_pass else StepResult.of(step.run(state))
        records.append(StepRecord(step.name, result))
        if result.failed:
            raise StepFailed(step=step.name)
    return records


def _run_fx_pass(step: Step[State], state: State, context: DiagnosticContext) -> StepResult:
    """One FX pass as a diagnostic scope (FXE0010, level none): its time; at
    logging.DEBUG verbosity the node count of the graph before and after."""
    with context.scope(rules.FX_PASS, Level.NONE, pass_name=step.name) as diagnostic:
        graph_of = step.graph if step.graph is not None and diagnostic.would_log(logging.DEBUG) else None
        before_module = graph_of(state) if graph_of is not None else None
        before = len(before_module.graph.nodes) if before_module is not None else None
        start = time.perf_counter()
        result = StepResult.of(step.run(state))
        seconds = time.perf_counter() - start
        diagnostic.properties["seconds"] = round(seconds, 6)
        diagnostic.log(f"`{step.name}` took {seconds:.4f} s.", logging.INFO)
        after_module = graph_of(state) if graph_of is not None else None
        if before is not None and after_module is not None:
            diagnostic.log(f"FX nodes: {before} before, {len(after_module.graph.nodes)} after.")
        for note in result.notes:
            diagnostic.log(note)
    return result


def on_every_graph(graph_pass: Callable[..., int]) -> Callable[..., int]:
    """A graph pass that edits one GraphModule in place, run on it and on every branch
    and body it reaches; returns the sum of the pass's counts."""

    def run(graph_module: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> int:
        return sum(graph_pass(module, *args, **kwargs) or 0 for module in graph_modules(graph_module))

    run.__name__ = getattr(graph_pass, "__name__", "graph_pass")
    run.__doc__ = graph_pass.__doc__
    return run
