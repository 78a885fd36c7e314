"""A capture that fails on a Python branch over tensor values in the model's own code: what
that means for export-hf.

The capture's hint names the model's line (fx2onnx.capture.value_branches): Qwen4-Exp's token
indexer counts each query's visible tokens with `torch.nonzero` and branches on the count in
its decode step; Longformer's (and LED's) sliding-window attention sizes its chunks with
`torch.div` of the sequence length, a tensor, and branches on whether any token attends
globally, in every pass. For an export-hf user the hint's usual way out, passing other
inputs, is no way out: export-hf feeds the graph the inputs its clients feed, so the error
says that nothing export-hf is given changes it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fx2onnx.capture import value_branch
from fx2onnx.hub.loading import LoadedModel


class ValueBranchError(RuntimeError):
    """The model's code branches in Python on tensor values in a graph export-hf captures:
    no input or option of export-hf avoids it."""


@dataclass(frozen=True)
class CapturedGraph:
    """What export-hf captured, for the error: the graph's name ("decode step") and the inputs
    export-hf feeds it."""

    name: str
    fed: str


DECODE_STEP = CapturedGraph("decode step", "every input its forward takes (attention_mask, position_ids)")
# a one-pass task's model, a sequence-to-sequence model's encoder and decoder steps
ONE_PASS = CapturedGraph("input", "the inputs the task's pipeline passes it")
SEQ2SEQ = CapturedGraph("encoder input and decoder step", "the inputs the task's generation loop passes it")


def value_branch_failure(
    loaded: LoadedModel, error: BaseException, report: str | os.PathLike | None, graph: CapturedGraph = DECODE_STEP,
) -> ValueBranchError | None:
    """The error to raise when ``error`` (a failed capture of ``graph``) is a branch on tensor
    values in ``loaded``'s own code; None when it is not, or no line of the model's code is found."""
    branch = value_branch(loaded.model, error)
    if branch is None:
        return None
    where = f" The capture's SARIF report is at '{os.path.abspath(report)}'." if report is not None else ""
    return ValueBranchError(
        f"{type(loaded.model).__name__} ({loaded.config.model_type}) decides a Python branch or size on values "
        f"computed from tensors at {branch}, which torch.export cannot capture in one graph for every {graph.name} "
        f"({branch.cause}). export-hf gives the model {graph.fed}, so no option avoids it: there is no "
        f"{loaded.task} folder for this model as its code is written. Nothing was written.{where} That code written "
        "without Python branches on tensor values (torch.where, torch.cond) would export."
    )
