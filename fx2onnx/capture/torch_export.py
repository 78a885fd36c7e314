"""Capture: from what the user gave to an ExportedProgram (or an aten-level GraphModule)."""

from __future__ import annotations

import contextlib
import traceback
import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from diagnostics import DiagnosticContext, Level, Stack, exception_summary, rules
from dispatcher import node_location, node_stack, stack_location
from fx2onnx.capture.dynamic_dims.check import (
    FixedDynamicDimError,
    check_dynamic_dims,
    fixed_dims_text,
    leaves_in_input_order,
    explain_fixed_dims,
    is_fixed_dim_error,
    record_at,
)
from fx2onnx.capture.aliased_inputs import AliasGroup, IndependentExample, independent_example
from fx2onnx.capture.dynamic_dims.branches import branch_conditions
from fx2onnx.capture.dynamic_dims.size_one import Example, grown_example
from fx2onnx.capture.dynamic_dims.taken_as_one import sizes_taken_as_one
from fx2onnx.capture.dynamic_dims.guards import SourcePlace, model_lines_comparing, size_one_symbols, sound_size_oblivious_capture
from fx2onnx.capture.dynamic_dims.signature import capture_signature
from fx2onnx.capture.dynamic_dims.spec import (
    DynamicDimError,
    DynamicShapesOption,
    RequestedDims,
    SpecializedDim,
    relaxed_spec,
    requested_dynamic_dims,
    specialized_dims,
    torch_export_spec,
)
from fx2onnx.capture.dynamic_dims.switches import keep_size_one_dims_dynamic, symbolic_math
from fx2onnx.capture.fake_mode import check_fake_mode_use
from fx2onnx.capture.tensor_subclasses import TensorSubclassError, without_tensor_subclasses
from fx2onnx.options import ONNXFakeContext
from fx2onnx.steps import StepFailed
from fx2onnx.capture.hints import CaptureFailure, capture_hint, explain
from fx2onnx.capture.library_adapters import library_adapters_at_capture


class CaptureError(StepFailed, RuntimeError):
    """torch.export could not capture the model (both non-strict and strict were tried);
    the errors are recorded as diagnostics."""


@dataclass
class CapturedModel:
    """The FX graph to translate and what is needed to map inputs onto it."""

    graph_module: torch.fx.GraphModule
    exported_program: torch.export.ExportedProgram | None
    dynamic_shapes_spec: Any = None
    notes: list[str] = field(default_factory=list)
    # captured with size-oblivious reasoning: retraces (decomposition) must use it too,
    # or torch derives sizes from the example's 0/1 dims (`seq // batch`)
    size_oblivious: bool = False
    # example inputs that shared storage, captured from copies (`aliased_inputs`)
    alias_groups: tuple[AliasGroup, ...] = ()


def _is_aten_graph(graph_module: torch.fx.GraphModule) -> bool:
    for node in graph_module.graph.nodes:
        if node.op in ("call_method", "call_module"):
            return False
        if node.op == "call_function" and not isinstance(node.target, torch._ops.OpOverload):
            if getattr(node.target, "__module__", None) not in ("_operator", "math", "builtins"):
                return False
    return True


def _has_fake_metadata(graph_module: torch.fx.GraphModule) -> bool:
    """Every value already carries FakeTensor metadata of one fake mode (make_fx graphs
    traced in "fake" or "symbolic" mode do): keep it, with its symbolic sizes, instead of
    propagating again. A "real" make_fx trace gives each value a mode of its own."""
    modes = set()
    for node in graph_module.graph.nodes:
        if node.op not in ("placeholder", "call_function"):
            continue
        if "val" not in node.meta:
            return False
        for value in torch.utils._pytree.tree_leaves(node.meta["val"]):
            if isinstance(value, torch._subclasses.fake_tensor.FakeTensor):
                modes.add(id(value.fake_mode))
    return len(modes) == 1


def copy_graph_module(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A GraphModule with its own graph: nodes are copied (their metadata dicts too, the
    FakeTensors in them shared), weights and sub-modules are shared, not copied."""
    graph = torch.fx.Graph(tracer_cls=graph_module.graph._tracer_cls)
    graph._codegen = graph_module.graph._codegen  # e.g. torch.export's pytree signature
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in graph_module.graph.nodes:  # the output node too, with its metadata
        copies[node] = graph.node_copy(node, lambda original: copies[original])
    copy = torch.fx.GraphModule(graph_module, graph, class_name=type(graph_module).__name__)
    copy.meta.update(graph_module.meta)
    return copy


def _fake_propagate(graph_module: torch.fx.GraphModule, args: Sequence[Any]) -> None:
    """Fill node.meta['val'] of an aten-level GraphModule by running it on FakeTensors."""
    mode = torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=True)
    fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    FakeTensorProp(graph_module, mode).propagate_dont_convert_inputs(*fake_args)


def _record_capture_failure(
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


def capture_model(
    model: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    dynamic_shapes: DynamicShapesOption,
    context: DiagnosticContext,
    fake_context: ONNXFakeContext | None = None,
) -> CapturedModel:
    """Turn an nn.Module, ExportedProgram or GraphModule into a graph with FakeTensor metadata."""
    try:
        check_fake_mode_use(model, args, kwargs, fake_context)
    except ValueError as error:  # fake and real tensors mixed: a capture failure with its hint
        failure = CaptureFailure(error, model, args, kwargs)
        _record_capture_failure(context, failure)
        raise CaptureError(f"{error}\nHint: {capture_hint(failure)}") from error
    if isinstance(model, torch.export.ExportedProgram):
        program = _plain(model, context)
        return CapturedModel(program.graph_module, program)
    if isinstance(model, torch.fx.GraphModule) and _is_aten_graph(model):
        graph_module = copy_graph_module(model)  # later stages edit it: not the user's
        if not _has_fake_metadata(graph_module):
            _fake_propagate(graph_module, [*args, *kwargs.values()])
        return CapturedModel(graph_module, None)
    if not isinstance(model, torch.nn.Module):
        if not callable(model) or isinstance(model, type):
            failure = CaptureFailure(TypeError(f"{type(model).__name__} is not a model"), model, args, kwargs)
            _record_capture_failure(context, failure)
            raise CaptureError(f"Not a model: {capture_hint(failure)}") from failure.error
        model = _CallableModule(model)
    user_model = model.function if isinstance(model, _CallableModule) else model
    independent = independent_example(model, args, kwargs)  # aliased inputs: copies of their own
    args, kwargs = independent.args, independent.kwargs
    spec = torch_export_spec(dynamic_shapes, model, args, kwargs)
    try:
        requested = requested_dynamic_dims(spec, model, args, kwargs, explicit=dynamic_shapes is not True)
    except DynamicDimError as error:
        failure = CaptureFailure(error, user_model, args, kwargs, dynamic_shapes)
        _record_capture_failure(context, failure)
        raise CaptureError(f"{error}\nHint: {capture_hint(failure)}") from error
    errors: list[BaseException] = []
    size_one_dims = _has_size_one_dynamic_dim(requested, args, kwargs)
    example = Example(tuple(args), dict(kwargs), requested)
    model_lines: list[SourcePlace] = []
    if size_one_dims:
        kept, model_lines = _capture_grown(model, spec, example, context)
        if kept is not None:
            return _captured(context, spec, kept, strict=False, errors=errors, independent=independent)
    for strict, size_oblivious in _capture_attempts(size_one_dims):
        try:
            program = _export(model, args, kwargs, spec, strict, size_oblivious)
        except Exception as error:  # noqa: BLE001 - try the next mode, then report all
            errors.append(error)
            if size_oblivious and is_fixed_dim_error(error):  # a named dim of example size 1
                _warn_model_compares_named_dims(context, model_lines)
            kept = None
        else:
            sound = not size_oblivious or sound_size_oblivious_capture(program, _size_one_symbols_of(program, example))
            kept = (program, example, size_oblivious) if sound else None
        if kept is not None:
            return _captured(context, spec, kept, strict=strict, errors=errors, independent=independent)
    failure = CaptureFailure(errors[0], user_model, args, kwargs, dynamic_shapes)
    fixed: list[SpecializedDim] = []
    if requested and any(is_fixed_dim_error(error) for error in errors):
        recapture = lambda relaxed: _export(model, args, kwargs, relaxed, False, False)  # noqa: E731
        fixed = explain_fixed_dims(context, recapture, spec, requested, args, kwargs)
    _record_capture_failure(context, failure, *errors[1:], fixed=fixed)
    if fixed:
        raise CaptureError(f"{fixed_dims_text(fixed)}\n{explain(errors[0])}\nHint: {capture_hint(failure)}") from errors[0]
    raise CaptureError(
        "torch.export could not capture the model.\n"
        f"  non-strict: {exception_summary(errors[0])}\n"
        f"  strict:     {exception_summary(errors[-1])}\n"
        f"Hint: {capture_hint(failure)}"
    ) from errors[0]


def _plain(program: torch.export.ExportedProgram, context: DiagnosticContext) -> torch.export.ExportedProgram:
    """A given program without tensor-subclass weights; one that keeps them is a capture
    failure naming the subclasses."""
    try:
        return without_tensor_subclasses(program)
    except TensorSubclassError as error:
        failure = CaptureFailure(error, program, (), {})
        _record_capture_failure(context, failure)
        raise CaptureError(str(error)) from error


def _captured(
    context: DiagnosticContext, spec: Any, kept: tuple[torch.export.ExportedProgram, Example, bool], *, strict: bool,
    errors: list[BaseException], independent: IndependentExample,
) -> CapturedModel:
    """The capture kept, its dynamic dims checked against what was asked."""
    program, used_example, size_oblivious = kept
    program = _plain(program, context)
    captured = CapturedModel(program.graph_module, program, spec, size_oblivious=size_oblivious, alias_groups=independent.groups)
    if strict and errors:
        _record_strict_fallback(context, captured, errors[0])
    try:
        captured.notes += check_dynamic_dims(context, program, used_example.requested, used_example.args, used_example.kwargs)
    except FixedDynamicDimError as error:
        raise CaptureError(str(error)) from error
    captured.notes += _report_sizes_taken_as_one(context, program)
    captured.notes += _report_branch_conditions(context, program, used_example)
    return captured


def _report_sizes_taken_as_one(context: DiagnosticContext, program: torch.export.ExportedProgram) -> list[str]:
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


def _report_branch_conditions(context: DiagnosticContext, program: torch.export.ExportedProgram, example: Example) -> list[str]:
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


def _export(model: Any, args: Sequence[Any], kwargs: Mapping[str, Any], spec: Any, strict: bool, size_oblivious: bool) -> torch.export.ExportedProgram:
    with keep_size_one_dims_dynamic(size_oblivious), symbolic_math(), library_adapters_at_capture(), \
            _keyword_inputs_as_parameters(model, kwargs):
        return torch.export.export(model, tuple(args), dict(kwargs), dynamic_shapes=spec, strict=strict)


@contextlib.contextmanager
def _keyword_inputs_as_parameters(model: torch.nn.Module, kwargs: Mapping[str, Any]) -> Iterator[None]:
    """For the duration of a capture, forward has the signature the dynamic-shapes spec was
    built for (`capture_signature`): keyword inputs that land in its ``**kwargs`` are
    parameters of their own. The call goes to forward as it is."""
    signature = capture_signature(model, kwargs)
    if signature is None:
        yield
        return
    own = model.__dict__.get("forward")  # an instance's own forward (_CallableModule)
    original = model.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs)

    forward.__signature__ = signature  # type: ignore[attr-defined]
    model.forward = forward
    try:
        yield
    finally:
        if own is None:
            del model.forward
        else:
            model.forward = own


def _capture_grown(
    model: Any, spec: Any, example: Example, context: DiagnosticContext
) -> tuple[tuple[torch.export.ExportedProgram, Example, bool] | None, list[SourcePlace]]:
    """The first capture when a dynamic dim has example size 1, which torch.export would
    fix wherever any code compares it: the example repeated to size 2 there
    (`size_one`), the size torch.export treats as general. Kept as (program, example,
    size-oblivious) when those dims stay dynamic and no line of the model's code compared
    them, so that the model computes the same at size 1 (torch's own comparisons, such as
    a kernel choosing its memory format by ``batch <= 1``, do). Returns (kept or None,
    the model's lines that compared them).

    Only a size-oblivious capture shows such a comparison (``size == 1`` is a guard
    there; the plain mode decides it False for any size of 2 or more without one), so it
    comes first and judges; a named dim that a guard refused is judged by the same capture
    with the dims as Dim.AUTO. The plain mode is tried only after that found no line of
    the model's. Size-oblivious reasoning is also much faster (Swin: 17 s against 148 s)."""
    grown = grown_example(example.args, example.kwargs, example.requested)
    if not grown.grown_dims:  # only dims of size 0: nothing to grow
        return None, []
    for size_oblivious in (True, False):
        try:
            program = _export(model, grown.args, grown.kwargs, spec, False, size_oblivious)
        except Exception as error:  # noqa: BLE001 - the captures of the example follow; say why
            context.record(
                rules.CAPTURE_FAILURE, Level.NOTE,
                message=f"Capturing the example with its size-1 dynamic dims grown to 2 failed: {exception_summary(error)}",
            )
            if not size_oblivious:
                break
            model_lines = _model_lines_of_refused_grown_capture(model, spec, grown, example, error, context)
            if model_lines is None or model_lines:  # not judged, or the model compares: capture the example itself
                return None, model_lines or []
            continue
        model_lines = model_lines_comparing(program, _size_one_symbols_of(program, example))
        if model_lines:  # the model may branch otherwise at size 1: capture the example itself
            return None, model_lines
        if size_oblivious and not sound_size_oblivious_capture(program, set()):
            continue
        fixed = specialized_dims(program, grown.requested, leaves_in_input_order(program, grown.args, grown.kwargs))
        if any((dim.input_name, dim.dim) in grown.grown_dims for dim in fixed):
            continue
        context.record(
            rules.CAPTURE_FAILURE, Level.NOTE,
            message="Size 1 in the example at " + ", ".join(f"dim {dim} of input '{path}'" for path, dim in sorted(grown.grown_dims))
            + ": torch.export fixes such a dim wherever code compares it, and no line of the model's code does, so the "
            "model was captured from its example repeated to size 2 there, which keeps those dims dynamic.",
        )
        return (program, grown, size_oblivious), []
    return None, []


def _size_one_symbols_of(program: torch.export.ExportedProgram, example: Example) -> set[Any]:
    """The program's symbols of the dims of example size 0 or 1 (the dims a grown
    capture grew)."""
    return size_one_symbols(program, leaves_in_input_order(program, example.args, example.kwargs))


def _model_lines_of_refused_grown_capture(
    model: Any, spec: Any, grown: Example, example: Example, error: BaseException, context: DiagnosticContext
) -> list[SourcePlace] | None:
    """torch.export refused the size-oblivious capture of the grown example because a
    guard fixed a named dim: the lines of the model's code among those guards, from the
    same capture with every dynamic dim as Dim.AUTO (empty: only torch's own code); None
    when that cannot be told (another failure)."""
    if not is_fixed_dim_error(error):
        return None
    try:
        judge = _export(model, grown.args, grown.kwargs, relaxed_spec(spec), False, True)
    except Exception as relaxed_error:  # noqa: BLE001 - the captures of the example follow; say why
        context.record(
            rules.CAPTURE_FAILURE, Level.NOTE,
            message=f"Capturing the grown example with every dynamic dim as Dim.AUTO failed too: {exception_summary(relaxed_error)}",
        )
        return None
    return model_lines_comparing(judge, _size_one_symbols_of(judge, example))


def _warn_model_compares_named_dims(context: DiagnosticContext, model_lines: list[SourcePlace]) -> None:
    """torch.export refused a named dynamic dim whose example size is 1: a warning names
    the lines of the model's code that compare it (found by `_capture_grown`)."""
    places = sorted({str(place) for place in model_lines if place.file and place.line})
    if places:
        context.record(
            rules.CAPTURE_FAILURE, Level.WARNING,
            message="A named dynamic dim has size 1 in the example, and the model's code compares it at "
            + ", ".join(places) + ": export from an example of size 2 or more there, or change that line.",
        )


def _capture_attempts(size_one_dims: bool) -> list[tuple[bool, bool]]:
    """(strict, size_oblivious) in the order tried. When a dynamic dim has an example size
    of 0 or 1, non-strict capture is first tried with size-oblivious reasoning, which keeps
    such dims dynamic; model code that branches on such a size needs the plain mode."""
    attempts = [(False, True)] if size_one_dims else []
    return attempts + [(False, False), (True, False)]


def _has_size_one_dynamic_dim(requested: RequestedDims, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    for leaf in torch.utils._pytree.tree_leaves((tuple(args), dict(kwargs))):
        asked = requested.of(leaf)
        if asked is not None and any(leaf.shape[dim] in (0, 1) for dim in asked.dims):
            return True
    return False


def _record_strict_fallback(context: DiagnosticContext, captured: CapturedModel, error: BaseException) -> None:
    """Strict capture (TorchDynamo) traces the model differently from non-strict capture:
    the user must know which one the ONNX model comes from, and why."""
    message = (
        f"Non-strict torch.export failed ({exception_summary(error)}); the model was captured in "
        "strict mode instead, which traces Python code with TorchDynamo and may specialize or "
        "rewrite parts of it differently: compare the ONNX model's results with PyTorch's."
    )
    context.record(rules.CAPTURE_FAILURE, Level.WARNING, message=message)
    captured.notes.append(message)


class _CallableModule(torch.nn.Module):
    """Wraps a plain function so that torch.export can take it."""

    def __init__(self, function: Any) -> None:
        super().__init__()
        self.function = function
        # The instance's forward is the function itself: torch.export and the dynamic-shapes
        # spec then see its own signature (parameter names), not (*args, **kwargs).
        self.forward = _named_forward(function)

    def forward(self, *args: Any, **kwargs: Any) -> Any:  # replaced per instance in __init__
        return self.function(*args, **kwargs)


def _named_forward(function: Any) -> Any:
    """The user's function, run by a code object named `forward`.

    torch.export keeps only the frames of functions named `forward` in each node's stack
    trace; under its own name the user's function would vanish from it and every node
    would point at this module. Same code, globals, defaults and closure: only the name
    differs. Other callables (partials, callable objects) are returned as they are.
    """
    if not isinstance(function, types.FunctionType):
        return function
    code = function.__code__.replace(co_name="forward")
    renamed = types.FunctionType(code, function.__globals__, function.__name__, function.__defaults__, function.__closure__)
    renamed.__kwdefaults__ = function.__kwdefaults__
    return renamed


def model_name(model: Any) -> str:
    """How reports name the model: its class, or a plain function's own name."""
    if isinstance(model, _CallableModule):
        model = model.function
    if isinstance(model, types.FunctionType):
        return getattr(model, "__qualname__", model.__name__)
    return type(model).__name__
