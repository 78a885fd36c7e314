"""torch.export's capture attempts as one ordered list of strategies: each returns a
program or a refusal with its reason; the walk keeps the first program and the refusals
before it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.export import Dim

from diagnostics import DiagnosticContext, DiagnosticOptions
from fx2onnx.capture.capture_strategies import (
    CAPTURE_STRATEGIES,
    Captured,
    CaptureJob,
    ExampleAsGiven,
    GrownExample,
    Refusal,
    attempt_captures,
)
from fx2onnx.capture.dynamic_dims.guards import SourcePlace
from fx2onnx.capture.dynamic_dims.size_one import Example
from fx2onnx.capture.dynamic_dims.spec import requested_dynamic_dims


class Scale(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def _job(x: torch.Tensor) -> CaptureJob:
    spec = {"x": {0: Dim("batch")}}
    requested = requested_dynamic_dims(spec, Scale(), (x,), {}, explicit=True)
    return CaptureJob(Scale(), Example((x,), {}, requested), spec, DiagnosticContext("fx2onnx", "0", DiagnosticOptions()))


def test_the_attempts_are_tried_in_one_order() -> None:
    assert [strategy.name for strategy in CAPTURE_STRATEGIES] == [
        "grown example, size-oblivious", "grown example, plain", "non-strict, size-oblivious", "non-strict", "strict",
    ]


def test_an_example_without_size_one_dims_is_captured_as_given_non_strict() -> None:
    job = _job(torch.randn(3, 4))
    assert not job.has_size_one_dims
    assert [s.applies(job) for s in CAPTURE_STRATEGIES] == [False, False, False, True, True]
    kept, refusals = attempt_captures(job)
    assert isinstance(kept, Captured) and not kept.strict and not kept.size_oblivious and refusals == []
    assert kept.example is job.example


def test_a_size_one_dim_is_captured_from_the_grown_example() -> None:
    job = _job(torch.randn(1, 4))
    assert job.has_size_one_dims and job.grown.grown_dims == frozenset({("x", 0)})
    kept, refusals = attempt_captures(job)
    assert isinstance(kept, Captured) and kept.example is job.grown and kept.size_oblivious
    assert job.grown.args[0].shape == (2, 4) and refusals == []


@dataclass(frozen=True)
class _Refusing:
    name: str
    kind: str = "test"
    final: bool = False

    def applies(self, job: CaptureJob) -> bool:
        return self.kind not in job.settled

    def attempt(self, job: CaptureJob) -> Refusal:
        return Refusal(self.name, "not today", error=RuntimeError(self.name),
                       model_lines=(SourcePlace("model.py", 3),), final=self.final)


def test_the_walk_keeps_the_refusals_their_errors_and_lines_and_settles_a_final_kind() -> None:
    job = _job(torch.randn(3, 4))
    strategies = (_Refusing("first", final=True), _Refusing("skipped"), ExampleAsGiven(strict=False, size_oblivious=False))
    kept, refusals = attempt_captures(job, strategies)
    assert isinstance(kept, Captured)
    assert [(r.strategy, r.reason) for r in refusals] == [("first", "not today")]
    assert [str(e) for e in job.errors] == ["first"] and job.model_lines == [SourcePlace("model.py", 3)]
    assert str(job.model_lines[0]) == "model.py:3"


def test_a_strategy_that_fails_returns_a_refusal_with_torch_exports_error() -> None:
    class Failing(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("this model cannot run")

    job = _job(torch.randn(3, 4))
    job.model = Failing()
    outcome = ExampleAsGiven(strict=False, size_oblivious=False).attempt(job)
    assert isinstance(outcome, Refusal) and isinstance(outcome.error, ValueError)
    assert "this model cannot run" in outcome.reason
    assert not GrownExample(size_oblivious=True).applies(job)
