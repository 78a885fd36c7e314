"""What a capture tells the user: a failed capture at the user's line with its hint, and
the warnings about a capture kept (strict mode instead of non-strict, sizes taken as 1,
branches on the dynamic sizes that nothing checks, named dims the model compares)."""

from __future__ import annotations

import traceback
from collections.abc import Sequence

import torch

from diagnostics import DiagnosticContext, Level, Stack, exception_summary, rules
from dispatcher import node_location, node_stack, stack_location
from fx2onnx.capture.dynamic_dims.branches import branch_conditions
from fx2onnx.capture.dynamic_dims.check import fixed_dims_text, leaves_in_input_order, record_at
from fx2onnx.capture.dynamic_dims.guards import SourcePlace
from fx2onnx.capture.dynamic_dims.size_one import Example
from fx2onnx.capture.dynamic_dims.spec import SpecializedDim
from fx2onnx.capture.dynamic_dims.taken_as_one import sizes_taken_as_one
from fx2onnx.capture.hints import CaptureFailure, capture_hint, explain


def record_capture_failure(
    context: DiagnosticContext, failure: CaptureFailure, *others: BaseException, fixed: Sequence[SpecializedDim] = ()
) -> None:
    error = failure.error
    frames = traceback.extract_tb(error.__traceback__)
    # Where the user's line is found, in order: the code that fixed a dynamic dim; the
    # traceback; the "User stack" that torch.export writes into some messages (of either
    # capture mode); else, when nothing of the user's ran (inputs that do not fit, not a
    # model), the user's call of the exporter.
    candidates = [
        *(f'  File "{dim.location.file}", line {dim.location.line}, in forward\n' for dim in fixed if dim.location),
        "".join(traceback.format_list(frames)) + "\n" + str(error),
        *(str(other) for other in others),
        "".join(traceback.format_list(traceback.extract_stack())),
    ]
    for text in candidates:
        stack = Stack.from_python_traceback(text)
        location = stack_location(stack)
        if location is not None:
            break
    reason = f"{explain(error)}\nHint: {capture_hint(failure)}"
    if fixed:
        reason = f"{fixed_dims_text(list(fixed))}\n{reason}"
    diagnostic = context.record(rules.CAPTURE_FAILURE, Level.ERROR, location=location, stack=stack, reason=reason)
    diagnostic.log_source_exception(error)


def report_sizes_taken_as_one(context: DiagnosticContext, program: torch.export.ExportedProgram) -> list[str]:
    """A warning per line of code where a size computed from the dynamic dims was taken
    as 1 (`taken_as_one`); returns their texts."""
    notes: list[str] = []
    for node in sizes_taken_as_one(program.graph_module.graph):
        location = node_location(node)
        where = str(location) if location is not None else f"node '{node.name}'"
        message = (
            f"A size computed from the dynamic input dims is 1 for the example, and {node.target} at {where} took it "
            "as 1 for every input: the ONNX model may fail or differ where that size is larger. Export from an "
            "example where it is 2 or more (larger inputs)."
        )
        if message not in notes:
            context.record(rules.CAPTURE_FAILURE, Level.WARNING, message=message, location=location, stack=node_stack(node))
            notes.append(message)
    return notes


def report_branch_conditions(context: DiagnosticContext, program: torch.export.ExportedProgram, example: Example) -> list[str]:
    """A warning per line of the model's code whose branch on the dynamic sizes holds
    only under a condition that nothing checks (`branches`); returns their texts."""
    notes: list[str] = []
    try:
        branches = branch_conditions(program, leaves_in_input_order(program, example.args, example.kwargs))
    except Exception as error:  # noqa: BLE001 - advice only: the export goes on without it, and says so
        context.record(rules.CAPTURE_FAILURE, Level.NOTE,
                       message=f"The conditions the model's branches put on the dynamic sizes were not checked: {exception_summary(error)}")
        return notes
    for branch in branches:
        message = (
            f"The model's code branches on the dynamic input sizes at {branch.filename}:{branch.line}, and the capture "
            f"took the example's branch, where {' and '.join(branch.conditions)}. Neither torch.export nor the ONNX "
            "model checks this: for inputs where it does not hold, the ONNX model may compute something other than "
            "PyTorch does. Check its results at the sizes you will use, or export those dims static."
        )
        record_at(context, Level.WARNING, message, SourcePlace(branch.filename, branch.line))
        notes.append(message)
    return notes


def warn_model_compares_named_dims(context: DiagnosticContext, model_lines: list[SourcePlace]) -> None:
    """torch.export refused a named dynamic dim whose example size is 1: a warning names
    the lines of the model's code that compare it (found by the grown capture)."""
    places = sorted({str(place) for place in model_lines if place.file and place.line})
    if places:
        context.record(
            rules.CAPTURE_FAILURE, Level.WARNING,
            message="A named dynamic dim has size 1 in the example, and the model's code compares it at "
            + ", ".join(places) + ": export from an example of size 2 or more there, or change that line.",
        )


def record_strict_fallback(context: DiagnosticContext, error: BaseException) -> str:
    """Strict capture (TorchDynamo) traces the model differently from non-strict capture:
    the user must know which one the ONNX model comes from, and why."""
    message = (
        f"Non-strict torch.export failed ({exception_summary(error)}); the model was captured in "
        "strict mode instead, which traces Python code with TorchDynamo and may specialize or "
        "rewrite parts of it differently: compare the ONNX model's results with PyTorch's."
    )
    context.record(rules.CAPTURE_FAILURE, Level.WARNING, message=message)
    return message
