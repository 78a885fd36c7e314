"""A decode step whose capture fails on a Python branch over tensor values: the model's line named.

torch.export refuses a Python branch or size that depends on a tensor's values
(GuardOnDataDependentSymNode: Qwen4-Exp's token indexer counts each query's visible tokens
with `torch.nonzero` and branches on the count). The capture's own hint suggests passing
the mask and positions, which export-hf already does: for an export-hf user the cause is the
model's code, and the error says which line, and that nothing export-hf is given changes it.
"""

from __future__ import annotations

import inspect
import os
import traceback
from collections.abc import Iterator

import torch

from fx2onnx.hub.loading import LoadedModel

# what torch.export's errors say of a branch or size on tensor values
_DATA_DEPENDENT = ("GuardOnDataDependentSymNode", "data-dependent expression")


class ValueBranchError(RuntimeError):
    """The model's code branches in Python on tensor values in the decode step export-hf
    captures: no input or option of export-hf avoids it."""


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _model_files(model: torch.nn.Module) -> set[str]:
    """The source files of the model's module classes."""
    files = set()
    for module in model.modules():
        try:
            files.add(os.path.realpath(inspect.getsourcefile(type(module)) or ""))
        except TypeError:  # a class without a source file
            continue
    return files - {""}


def _shown(path: str) -> str:
    """A library's file from its package down (transformers/models/...), else the path."""
    return path.replace("\\", "/").split("site-packages/")[-1]


def value_branch_failure(loaded: LoadedModel, error: BaseException, report: str | os.PathLike | None) -> ValueBranchError | None:
    """The error to raise when ``error`` (a failed capture) is a branch on tensor values in
    ``loaded``'s own code; None when it is not, or no line of the model's code is found."""
    files = _model_files(loaded.model)
    for cause in reversed(list(_chain(error))):  # the innermost first: its traceback ends in the model's code
        text = f"{type(cause).__name__}: {cause}"
        if not any(needle in text for needle in _DATA_DEPENDENT):
            continue
        frames = [f for f in traceback.extract_tb(cause.__traceback__) if os.path.realpath(f.filename) in files]
        if not frames:
            continue
        frame = frames[-1]
        said = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        where = f" The capture's SARIF report is at '{os.path.abspath(report)}'." if report is not None else ""
        return ValueBranchError(
            f"{type(loaded.model).__name__} ({loaded.config.model_type}) decides a Python branch or size on values "
            f"computed from tensors at {_shown(frame.filename)}:{frame.lineno} in {frame.name} (`{frame.line}`), "
            f"which torch.export cannot capture in one graph for every decode step ({type(cause).__name__}: {said}). "
            "export-hf gives the model every input its forward takes (attention_mask, position_ids), so no option "
            "avoids it: there is no text-generation folder for this model as its code is written. Nothing was "
            f"written.{where} That code written without Python branches on tensor values (torch.where, torch.cond) "
            "would export."
        )
    return None
