"""torch.export's attempts at capturing a model, as one ordered list of strategies,
`CAPTURE_STRATEGIES`, and the walk over it (`attempt_captures`).

Each strategy says whether it applies to the job and returns either the program it
captured (`Captured`) or a `Refusal` with its reason, the failure it met and the lines of
the model's code involved. The walk keeps the first capture; the refusals, in order,
explain a failure. A new capture fallback is one more strategy in the list.

When a dynamic dim has example size 0 or 1, torch.export would fix it wherever any code
compares it: the example grown to size 2 there (`size_one`) comes first, size-oblivious
then plain, and a line of the model's code that compares such a dim settles the grown
attempts; then the example itself, size-oblivious (which keeps such dims dynamic), plain,
and strict (TorchDynamo) last.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from diagnostics import DiagnosticContext, Level, exception_summary, rules
from fx2onnx.capture.capture_reports import warn_model_compares_named_dims
from fx2onnx.capture.dynamic_dims.check import is_fixed_dim_error, leaves_in_input_order
from fx2onnx.capture.dynamic_dims.guards import SourcePlace, model_lines_comparing, size_one_symbols, sound_size_oblivious_capture
from fx2onnx.capture.dynamic_dims.size_one import Example, grown_example
from fx2onnx.capture.dynamic_dims.spec import relaxed_spec, specialized_dims
from fx2onnx.capture.torch_export import run_torch_export


@dataclass
class CaptureJob:
    """What every strategy reads: the model (an nn.Module), its example with the dims
    asked to be dynamic, the dynamic-shapes spec; and what the walk learnt so far."""

    model: torch.nn.Module
    example: Example
    spec: Any
    context: DiagnosticContext
    errors: list[BaseException] = field(default_factory=list)  # torch.export's failures, in order
    model_lines: list[SourcePlace] = field(default_factory=list)  # the model's lines comparing size-1 dims
    settled: set[str] = field(default_factory=set)  # kinds of attempt that need not run again
    _grown: Example | None = None

    @property
    def has_size_one_dims(self) -> bool:
        """Whether a dim asked to be dynamic has example size 0 or 1."""
        leaves = torch.utils._pytree.tree_leaves((self.example.args, self.example.kwargs))
        for leaf in leaves:
            asked = self.example.requested.of(leaf)
            if asked is not None and any(leaf.shape[dim] in (0, 1) for dim in asked.dims):
                return True
        return False

    @property
    def grown(self) -> Example:
        """The example with its size-1 dynamic dims repeated to size 2."""
        if self._grown is None:
            self._grown = grown_example(self.example.args, self.example.kwargs, self.example.requested)
        return self._grown


@dataclass(frozen=True)
class Captured:
    """A program a strategy captured, from which example, in which mode."""

    program: torch.export.ExportedProgram
    example: Example
    size_oblivious: bool
    strict: bool


@dataclass(frozen=True)
class Refusal:
    """Why a strategy kept no program: its reason, torch.export's failure (if it failed),
    the lines of the model's code involved; `final` settles every attempt of its kind."""

    strategy: str
    reason: str
    error: BaseException | None = None
    model_lines: tuple[SourcePlace, ...] = ()
    final: bool = False


def _size_one_symbols_of(program: torch.export.ExportedProgram, example: Example) -> set[Any]:
    """The program's symbols of the dims of example size 0 or 1 (the dims a grown
    capture grew)."""
    return size_one_symbols(program, leaves_in_input_order(program, example.args, example.kwargs))


@dataclass(frozen=True)
class GrownExample:
    """The example with its size-1 dynamic dims repeated to 2, the size torch.export
    treats as general. Kept when those dims stay dynamic and no line of the model's code
    compared them, so that the model computes the same at size 1 (torch's own
    comparisons, such as a kernel choosing its memory format by ``batch <= 1``, do).

    Only a size-oblivious capture shows such a comparison (``size == 1`` is a guard
    there; the plain mode decides it False for any size of 2 or more without one), so it
    comes first and judges; a named dim that a guard refused is judged by the same
    capture with the dims as Dim.AUTO. Size-oblivious reasoning is also much faster
    (Swin: 17 s against 148 s)."""

    size_oblivious: bool
    kind = "grown example"

    @property
    def name(self) -> str:
        return f"grown example, {'size-oblivious' if self.size_oblivious else 'plain'}"

    def applies(self, job: CaptureJob) -> bool:
        # only dims of size 0: nothing to grow
        return job.has_size_one_dims and self.kind not in job.settled and bool(job.grown.grown_dims)

    def attempt(self, job: CaptureJob) -> Captured | Refusal:
        grown, context = job.grown, job.context
        try:
            program = run_torch_export(job.model, grown.args, grown.kwargs, job.spec, False, self.size_oblivious)
        except Exception as error:  # noqa: BLE001 - the captures of the example follow; say why
            context.record(
                rules.CAPTURE_FAILURE, Level.NOTE,
                message=f"Capturing the example with its size-1 dynamic dims grown to 2 failed: {exception_summary(error)}",
            )
            if not self.size_oblivious:
                return Refusal(self.name, exception_summary(error), final=True)
            model_lines = self._judge_refused(job, error)
            # not judged, or the model compares: capture the example itself
            final = model_lines is None or bool(model_lines)
            return Refusal(self.name, exception_summary(error), model_lines=tuple(model_lines or ()), final=final)
        model_lines = model_lines_comparing(program, _size_one_symbols_of(program, job.example))
        if model_lines:  # the model may branch otherwise at size 1: capture the example itself
            return Refusal(self.name, "the model's code compares the size-1 dims", model_lines=tuple(model_lines), final=True)
        if self.size_oblivious and not sound_size_oblivious_capture(program, set()):
            return Refusal(self.name, "the size-oblivious capture holds for the example only")
        fixed = specialized_dims(program, grown.requested, leaves_in_input_order(program, grown.args, grown.kwargs))
        if any((dim.input_name, dim.dim) in grown.grown_dims for dim in fixed):
            return Refusal(self.name, "the capture fixed a grown dim")
        context.record(
            rules.CAPTURE_FAILURE, Level.NOTE,
            message="Size 1 in the example at " + ", ".join(f"dim {dim} of input '{path}'" for path, dim in sorted(grown.grown_dims))
            + ": torch.export fixes such a dim wherever code compares it, and no line of the model's code does, so the "
            "model was captured from its example repeated to size 2 there, which keeps those dims dynamic.",
        )
        return Captured(program, grown, self.size_oblivious, strict=False)

    def _judge_refused(self, job: CaptureJob, error: BaseException) -> list[SourcePlace] | None:
        """torch.export refused the size-oblivious capture of the grown example because a
        guard fixed a named dim: the lines of the model's code among those guards, from
        the same capture with every dynamic dim as Dim.AUTO (empty: only torch's own
        code); None when that cannot be told (another failure)."""
        if not is_fixed_dim_error(error):
            return None
        grown = job.grown
        try:
            judge = run_torch_export(job.model, grown.args, grown.kwargs, relaxed_spec(job.spec), False, True)
        except Exception as relaxed_error:  # noqa: BLE001 - the captures of the example follow; say why
            job.context.record(
                rules.CAPTURE_FAILURE, Level.NOTE,
                message=f"Capturing the grown example with every dynamic dim as Dim.AUTO failed too: {exception_summary(relaxed_error)}",
            )
            return None
        return model_lines_comparing(judge, _size_one_symbols_of(judge, job.example))


@dataclass(frozen=True)
class ExampleAsGiven:
    """torch.export of the example itself: non-strict, with size-oblivious reasoning
    (only when a dynamic dim has example size 0 or 1: it keeps such dims dynamic; model
    code that branches on such a size needs the plain mode) or plain; or strict."""

    strict: bool
    size_oblivious: bool
    kind = "example"

    @property
    def name(self) -> str:
        mode = "strict" if self.strict else "non-strict"
        return f"{mode}{', size-oblivious' if self.size_oblivious else ''}"

    def applies(self, job: CaptureJob) -> bool:
        return not self.size_oblivious or job.has_size_one_dims

    def attempt(self, job: CaptureJob) -> Captured | Refusal:
        example = job.example
        try:
            program = run_torch_export(job.model, example.args, example.kwargs, job.spec, self.strict, self.size_oblivious)
        except Exception as error:  # noqa: BLE001 - try the next mode, then report all
            if self.size_oblivious and is_fixed_dim_error(error):  # a named dim of example size 1
                warn_model_compares_named_dims(job.context, job.model_lines)
            return Refusal(self.name, exception_summary(error), error=error)
        if self.size_oblivious and not sound_size_oblivious_capture(program, _size_one_symbols_of(program, example)):
            return Refusal(self.name, "the size-oblivious capture holds for the example only")
        return Captured(program, example, self.size_oblivious, self.strict)


CAPTURE_STRATEGIES: tuple[GrownExample | ExampleAsGiven, ...] = (
    GrownExample(size_oblivious=True),
    GrownExample(size_oblivious=False),
    ExampleAsGiven(strict=False, size_oblivious=True),
    ExampleAsGiven(strict=False, size_oblivious=False),
    ExampleAsGiven(strict=True, size_oblivious=False),
)


def attempt_captures(job: CaptureJob, strategies: Sequence[GrownExample | ExampleAsGiven] = CAPTURE_STRATEGIES) -> tuple[Captured | None, list[Refusal]]:
    """The first program a strategy that applies captures, and the refusals before it."""
    refusals: list[Refusal] = []
    for strategy in strategies:
        if not strategy.applies(job):
            continue
        outcome = strategy.attempt(job)
        if isinstance(outcome, Captured):
            return outcome, refusals
        refusals.append(outcome)
        if outcome.error is not None:
            job.errors.append(outcome.error)
        job.model_lines += outcome.model_lines
        if outcome.final:
            job.settled.add(strategy.kind)
    return None, refusals
