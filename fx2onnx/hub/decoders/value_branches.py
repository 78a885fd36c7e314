"""A decode step whose capture fails on a Python branch over tensor values: what that means
for export-hf.

The capture's hint names the model's line (fx2onnx.capture.value_branches): Qwen4-Exp's token
indexer counts each query's visible tokens with `torch.nonzero` and branches on the count.
For an export-hf user the hint's usual way out, passing the mask and positions, is taken
already: export-hf feeds the decode step every input its forward takes, so the error says
that nothing export-hf is given changes it.
"""

from __future__ import annotations

import os

from fx2onnx.capture.value_branches import value_branch
from fx2onnx.hub.loading import LoadedModel


class ValueBranchError(RuntimeError):
    """The model's code branches in Python on tensor values in the decode step export-hf
    captures: no input or option of export-hf avoids it."""


def value_branch_failure(loaded: LoadedModel, error: BaseException, report: str | os.PathLike | None) -> ValueBranchError | None:
    """The error to raise when ``error`` (a failed capture) is a branch on tensor values in
    ``loaded``'s own code; None when it is not, or no line of the model's code is found."""
    branch = value_branch(loaded.model, error)
    if branch is None:
        return None
    where = f" The capture's SARIF report is at '{os.path.abspath(report)}'." if report is not None else ""
    return ValueBranchError(
        f"{type(loaded.model).__name__} ({loaded.config.model_type}) decides a Python branch or size on values "
        f"computed from tensors at {branch}, which torch.export cannot capture in one graph for every decode step "
        f"({branch.cause}). export-hf gives the model every input its forward takes (attention_mask, position_ids), "
        "so no option avoids it: there is no text-generation folder for this model as its code is written. Nothing "
        f"was written.{where} That code written without Python branches on tensor values (torch.where, torch.cond) "
        "would export."
    )
