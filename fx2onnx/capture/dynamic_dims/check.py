"""After capture: every dim asked to be dynamic is dynamic, or the user is told which
input, which dim, and which line of the model fixed it.

A dim the user named (`Dim("batch")`, `Dim.DYNAMIC`) that the model fixes is an error;
torch.export refuses those itself, without the line, so the model is captured once more
with every dim as `Dim.AUTO` to find it. A dim only asked for with `dynamic_shapes=True`
or `Dim.AUTO` is a warning: the export goes on with that dim static.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from diagnostics import DiagnosticContext, Level, Stack, rules
from dispatcher import stack_location
from fx2onnx.capture.dynamic_dims.guards import SourcePlace
from fx2onnx.capture.dynamic_dims.spec import RequestedDims, SpecializedDim, relaxed_spec, specialized_dims


class FixedDynamicDimError(RuntimeError):
    """A dim the user named as dynamic is fixed by the model's code."""


def inputs_in_input_order(
    program: torch.export.ExportedProgram, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` with the keywords in the order of the program's user inputs:
    their pytree leaves are the program's user inputs, in order."""
    in_spec = program.call_spec.in_spec
    if in_spec is not None and in_spec.num_children == 2 and in_spec.child(1).context:
        kwargs = {key: kwargs[key] for key in in_spec.child(1).context if key in kwargs}
    return tuple(args), dict(kwargs)


def leaves_in_input_order(program: torch.export.ExportedProgram, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
    """The input leaves in the order of the program's user inputs."""
    return torch.utils._pytree.tree_leaves(inputs_in_input_order(program, args, kwargs))


def is_fixed_dim_error(error: BaseException) -> bool:
    """Whether torch.export refused the capture because a dynamic dim got fixed."""
    text = str(error)
    return "specialized it to be a constant" in text or "0/1 specialized" in text or "Constraints violated" in text


def check_dynamic_dims(
    context: DiagnosticContext,
    program: torch.export.ExportedProgram,
    requested: RequestedDims,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> list[str]:
    """Record a diagnostic for each requested dim the program fixes; raise
    FixedDynamicDimError for named ones. Returns the warning texts (for warnings.warn)."""
    fixed = specialized_dims(program, requested, leaves_in_input_order(program, args, kwargs))
    return _report(context, fixed)


def explain_fixed_dims(
    context: DiagnosticContext,
    recapture: Callable[[Any], torch.export.ExportedProgram],
    spec: Any,
    requested: RequestedDims,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> list[SpecializedDim]:
    """torch.export refused a named dynamic dim: capture again with every dim as
    Dim.AUTO (`recapture(spec)`) and return the named dims the model fixes (the caller
    reports them with the capture failure)."""
    try:
        program = recapture(relaxed_spec(spec))
    except Exception as error:  # noqa: BLE001 - the original capture errors are reported instead
        context.record(
            rules.CAPTURE_FAILURE, Level.NOTE,
            message=f"Capturing again with every dim as Dim.AUTO, to find the fixed dims, failed too: {type(error).__name__}: {error}",
        )
        return []
    return [dim for dim in specialized_dims(program, requested, leaves_in_input_order(program, args, kwargs)) if dim.explicit]


def fixed_dims_text(fixed: list[SpecializedDim]) -> str:
    """The sentence a capture failure starts with when named dynamic dims were fixed."""
    return (
        "A dim asked to be dynamic is static in the ONNX model: "
        + "; ".join(dim.describe() for dim in fixed)
        + ". Change that code (or drop the dim from dynamic_shapes)."
    )


def _report(context: DiagnosticContext, fixed: list[SpecializedDim]) -> list[str]:
    warnings: list[str] = []
    for dim in fixed:
        message = f"A dim asked to be dynamic is static in the ONNX model: {dim.describe()}."
        if dim.explicit:
            message += " Change that code (or drop the dim from dynamic_shapes)."
        else:
            message += " The exported model accepts only this size there."
            warnings.append(message)
        record_at(context, Level.ERROR if dim.explicit else Level.WARNING, message, dim.location, fixed_dim_properties(dim))
    named = [dim for dim in fixed if dim.explicit]
    if named:
        raise FixedDynamicDimError("; ".join(dim.describe() for dim in named))
    return warnings


# the key of a diagnostic's properties that names the dim it reports fixed
FIXED_DIM = "fixedDim"


def fixed_dim_properties(dim: SpecializedDim) -> dict[str, Any]:
    """The diagnostic's properties that say which input's dim was fixed, to what and why:
    read by code that acts on it (export-hf's dim roles) without parsing the message."""
    return {FIXED_DIM: {"input": dim.input_name, "dim": dim.dim, "value": dim.value, "reason": dim.describe()}}


def record_at(
    context: DiagnosticContext, level: Level, message: str, location: SourcePlace | None,
    properties: dict[str, Any] | None = None,
) -> None:
    stack = None
    if location is not None:
        stack = Stack.from_frame_summaries([traceback.FrameSummary(location.file or "", location.line, "forward")])
    context.record(
        rules.CAPTURE_FAILURE, level, message=message,
        location=stack_location(stack) if stack is not None else None, stack=stack, properties=properties,
    )
