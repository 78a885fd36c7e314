"""The line of a model's code whose Python branch or size reads tensor values.

torch.export refuses a Python branch or size that depends on a tensor's values
(GuardOnDataDependentSymNode: `if x.sum() > 0`, `int(x.max())`, `.item()`). Its traceback
runs through torch's own files; the line to change is the innermost one in the model's
code (the files of its module classes, or of the function given). That line also tells
what the value comes from: a buffer or parameter the model holds (EoMT's `attn_mask_probs`)
is no input the user could pass instead.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch

# what torch.export's errors say of a branch or size on tensor values
DATA_DEPENDENT = ("GuardOnDataDependentSymNode", "data-dependent", "DataDependent", "unbacked", ".item()")

_ATTRIBUTE = re.compile(r"\bself\.(\w+)")


@dataclass(frozen=True)
class ValueBranch:
    """Where the model's code read tensor values for a Python branch or size, and torch's error."""

    file: str
    line: int
    function: str
    code: str
    held: tuple[str, ...]  # the module's own buffers and parameters the line reads: "buffer 'attn_mask_probs'"
    error: BaseException  # torch.export's error for it

    @property
    def shown_file(self) -> str:
        """A library's file from its package down (transformers/models/...), else the path."""
        return self.file.replace("\\", "/").split("site-packages/")[-1]

    def __str__(self) -> str:
        return f"{self.shown_file}:{self.line} in {self.function} (`{self.code}`)"

    @property
    def cause(self) -> str:
        """torch's error in one line: its type and the first line of its message."""
        said = str(self.error).strip().splitlines()
        return f"{type(self.error).__name__}: {said[0]}" if said else type(self.error).__name__


def held_value_advice(branch: ValueBranch) -> str:
    """What to say of a line that branches on a value the model holds (a buffer, a parameter)."""
    return (
        f"the model's code decides a Python branch or size by the value of its {' and '.join(branch.held)} "
        f"at {branch}: torch.export captures the model's buffers and parameters as tensors of unknown value, so no "
        "input or option changes it; that line written without a Python branch on the value (torch.where, "
        "torch.cond) would capture."
    )


def is_data_dependent(error: BaseException) -> bool:
    """Whether torch's error is a branch or size on tensor values."""
    text = f"{type(error).__name__}: {error}"
    return any(needle in text for needle in DATA_DEPENDENT)


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _model_files(model: Any) -> set[str]:
    """The source files of the model's module classes, or of the function given."""
    owners = [type(module) for module in model.modules()] if isinstance(model, torch.nn.Module) else [model]
    files = set()
    for owner in owners:
        try:
            files.add(os.path.realpath(inspect.getsourcefile(owner) or ""))
        except TypeError:  # a class or callable without a source file (a builtin)
            continue
    return files - {""}


def _frames(traceback: TracebackType | None) -> Iterator[TracebackType]:
    while traceback is not None:
        yield traceback
        traceback = traceback.tb_next


def _held_values(frame: Any, code: str) -> tuple[str, ...]:
    """The buffers and parameters of the frame's own module (`self`) that the line names."""
    module = frame.f_locals.get("self")
    if not isinstance(module, torch.nn.Module):
        return ()
    kinds = {**{name: "parameter" for name in module._parameters}, **{name: "buffer" for name in module._buffers}}
    names = dict.fromkeys(name for name in _ATTRIBUTE.findall(code) if name in kinds)  # `self.<name>`, in order
    return tuple(f"{kinds[name]} '{name}'" for name in names)


def _innermost_line(files: set[str], cause: BaseException) -> ValueBranch | None:
    """The innermost frame of ``cause``'s traceback in one of ``files``; None when none is."""
    ours = [tb for tb in _frames(cause.__traceback__) if os.path.realpath(tb.tb_frame.f_code.co_filename) in files]
    if not ours:
        return None
    innermost = ours[-1]
    summary = inspect.getframeinfo(innermost, context=1)
    code = (summary.code_context or [""])[0].strip()
    return ValueBranch(summary.filename, innermost.tb_lineno, summary.function, code,
                       _held_values(innermost.tb_frame, code), cause)


def value_branch(model: Any, error: BaseException) -> ValueBranch | None:
    """The innermost line of ``model``'s code in a failed capture that branched on tensor
    values (``error`` or an error it was raised from); None when the failure is of another
    kind or no line of the model's code is in its traceback."""
    files = _model_files(model)
    for cause in reversed(list(_chain(error))):  # the innermost first: its traceback ends in the model's code
        if is_data_dependent(cause):
            line = _innermost_line(files, cause)
            if line is not None:
                return line
    return None


def failing_line(model: Any, error: BaseException) -> ValueBranch | None:
    """The innermost line of ``model``'s code where ``error`` (raised by running the model
    in eager PyTorch, whatever its kind) was raised; None when its traceback has none."""
    return _innermost_line(_model_files(model), error)


__all__ = ["DATA_DEPENDENT", "ValueBranch", "failing_line", "held_value_advice", "is_data_dependent", "value_branch"]
