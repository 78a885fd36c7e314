"""What a capture gives (`CapturedModel`) and how it calls torch.export: one call under
the capture's switches (`run_torch_export`), a given program or aten-level GraphModule
taken as it is, a plain function as a module. The attempts, in order, are in
`capture_strategies`; the stage's steps in `capture_steps`."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from diagnostics import DiagnosticContext
from fx2onnx.capture.aliased_inputs import AliasGroup
from fx2onnx.capture.capture_reports import record_capture_failure
from fx2onnx.capture.dynamic_dims.signature import capture_signature
from fx2onnx.capture.dynamic_dims.switches import keep_size_one_dims_dynamic, symbolic_math
from fx2onnx.capture.hints import CaptureFailure
from fx2onnx.capture.library_adapters import TensorSubclassError, library_adapters_at_capture, without_tensor_subclasses

from fx2onnx.steps import StepFailed


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


def is_aten_graph(graph_module: torch.fx.GraphModule) -> bool:
    """Whether a GraphModule calls ATen operators only (and Python's arithmetic on sizes):
    such a graph is translated as it is, without torch.export."""
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


def graph_module_as_captured(graph_module: torch.fx.GraphModule, args: Sequence[Any], kwargs: Mapping[str, Any]) -> CapturedModel:
    """An aten-level GraphModule taken as it is: a copy (later stages edit it, not the
    user's), with FakeTensor metadata unless it has its own."""
    copy = copy_graph_module(graph_module)
    if not _has_fake_metadata(copy):
        _fake_propagate(copy, [*args, *kwargs.values()])
    return CapturedModel(copy, None)


def _fake_propagate(graph_module: torch.fx.GraphModule, args: Sequence[Any]) -> None:
    """Fill node.meta['val'] of an aten-level GraphModule by running it on FakeTensors."""
    mode = torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=True)
    fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    FakeTensorProp(graph_module, mode).propagate_dont_convert_inputs(*fake_args)


def plain_program(program: torch.export.ExportedProgram, context: DiagnosticContext) -> torch.export.ExportedProgram:
    """A given program without tensor-subclass weights; one that keeps them is a capture
    failure naming the subclasses."""
    try:
        return without_tensor_subclasses(program)
    except TensorSubclassError as error:
        failure = CaptureFailure(error, program, (), {})
        record_capture_failure(context, failure)
        raise CaptureError(str(error)) from error


def run_torch_export(
    model: Any, args: Sequence[Any], kwargs: Mapping[str, Any], spec: Any, strict: bool, size_oblivious: bool
) -> torch.export.ExportedProgram:
    """One torch.export call under the capture's switches: size-oblivious reasoning when
    asked, symbolic math, the library adapters, keyword inputs as parameters."""
    with keep_size_one_dims_dynamic(size_oblivious), symbolic_math(), library_adapters_at_capture(model), \
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


def as_module(model: Any) -> torch.nn.Module | None:
    """The model as an nn.Module torch.export takes: itself, or a plain function wrapped;
    None when it is neither (not a model)."""
    if isinstance(model, torch.nn.Module):
        return model
    if not callable(model) or isinstance(model, type):
        return None
    return _CallableModule(model)


def user_model(model: torch.nn.Module) -> Any:
    """What the user gave: the function a wrapping module calls, or the module itself."""
    return model.function if isinstance(model, _CallableModule) else model


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
