"""What to do about a failed capture: one table of error kinds, each with its own hint.

`capture_hint(failure)` classifies an error raised while capturing a model (by the error,
the model and the inputs it was given) and returns the one hint that fits its cause;
`explain(error)` keeps the lines of a torch.export message that explain the cause
(constraint violations, guards, suggested fixes) and drops tracebacks and boilerplate.
"""

from __future__ import annotations

import inspect
import os
import re
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from fx2onnx.capture.dynamic_dims.spec import capture_signature
from fx2onnx.capture.library_adapters import library_hint, transformers_version
from fx2onnx.capture.value_branches import DATA_DEPENDENT, held_value_advice, value_branch

# The versions the test suite runs on (constraints.txt; a test keeps the two equal).
TESTED_WITH = {"torch": "2.13.0", "transformers": "5.24.0"}


# The model of a failure known only by its error (`capture_hint(error)`).
UNKNOWN_MODEL: Any = object()


@dataclass
class CaptureFailure:
    """An error raised while capturing `model` on the given example inputs."""

    error: BaseException
    model: Any = UNKNOWN_MODEL
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    dynamic_shapes: Any = None

    @property
    def text(self) -> str:
        return f"{type(self.error).__name__}: {self.error}"


@dataclass(frozen=True)
class Hint:
    """One kind of capture failure: how to recognise it and what to tell the user."""

    kind: str
    matches: Callable[[CaptureFailure], bool]
    advice: Callable[[CaptureFailure], str]


# -- recognising the cause ------------------------------------------------------------------


def _is_model(model: Any) -> bool:
    return isinstance(model, (torch.nn.Module, torch.export.ExportedProgram)) or (
        callable(model) and not isinstance(model, type)
    )


def _input_leaves(failure: CaptureFailure) -> list[Any]:
    return pytree.tree_leaves((tuple(failure.args), dict(failure.kwargs)))


def _has_numpy_input(failure: CaptureFailure) -> bool:
    try:
        import numpy as np
    except ImportError:  # numpy missing: no numpy input can exist
        return False
    return any(isinstance(leaf, np.ndarray) for leaf in _input_leaves(failure))


def _meta_tensor_names(model: Any) -> list[str]:
    if not isinstance(model, torch.nn.Module):
        return []
    tensors = [*model.named_parameters(), *model.named_buffers()]
    return [name for name, tensor in tensors if tensor.device.type == "meta"]


def _has_meta_weights(failure: CaptureFailure) -> bool:
    return bool(_meta_tensor_names(failure.model)) and not _is_fake_input(failure)


def _is_fake_input(failure: CaptureFailure) -> bool:
    """Inputs made under a fake mode: meta-like weights are then expected."""
    fake = torch._subclasses.fake_tensor.FakeTensor
    return any(isinstance(leaf, fake) for leaf in _input_leaves(failure))


def _forward_of(model: Any) -> Any:
    return model.forward if isinstance(model, torch.nn.Module) else model


def signature_text(model: Any) -> str | None:
    """`forward(x, mask=None)`: how the model is called, None when Python cannot tell."""
    target = _forward_of(model)
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    name = getattr(target, "__name__", "forward")
    return f"{name}{signature}"


def _binding_error(failure: CaptureFailure) -> str | None:
    """Why the example inputs do not fit forward()'s parameters, None when they do."""
    try:
        signature = inspect.signature(_forward_of(failure.model))
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*failure.args, **failure.kwargs)
    except TypeError as error:
        return str(error)
    return None


def _wrong_arguments(failure: CaptureFailure) -> bool:
    return failure.model is not UNKNOWN_MODEL and _is_model(failure.model) and _binding_error(failure) is not None


_DYNAMIC_SPEC_WORDS = ("dynamic_shapes", "dynamic-shapes-validation", "Dim(")


def _bad_dynamic_spec(failure: CaptureFailure) -> bool:
    text = failure.text
    return "Constraints violated" not in text and any(word in text for word in _DYNAMIC_SPEC_WORDS)


_UNKNOWN_OUTPUT = re.compile(r"<class '([\w.]+)'> in output|UserDefinedObjectVariable\((\w+)\) at output")


def _unknown_output_type(failure: CaptureFailure) -> str | None:
    match = _UNKNOWN_OUTPUT.search(failure.text)
    return (match.group(1) or match.group(2)) if match else None


def _is_cache_output(failure: CaptureFailure) -> bool:
    name = _unknown_output_type(failure) or ""
    return name.endswith("Cache") or "cache_utils" in name


def _torch_frame(failure: CaptureFailure) -> traceback.FrameSummary | None:
    """The innermost frame of the error's traceback when it lies in torch's own files."""
    frames = traceback.extract_tb(failure.error.__traceback__)
    torch_root = os.path.dirname(torch.__file__) + os.sep
    if frames and os.path.abspath(frames[-1].filename).startswith(torch_root):
        return frames[-1]
    return None


def _inside_torch_export(failure: CaptureFailure) -> bool:
    """torch.export failed an internal check of its own: an assertion raised in torch's
    files, not an error about the model's code."""
    return isinstance(failure.error, AssertionError) and _torch_frame(failure) is not None


def _contains(*needles: str) -> Callable[[CaptureFailure], bool]:
    return lambda failure: any(needle in failure.text for needle in needles)


# -- what to say --------------------------------------------------------------------------


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _not_a_model_advice(failure: CaptureFailure) -> str:
    model = failure.model
    if isinstance(model, type):
        return (
            f"{model.__name__} is a class: pass an instance, e.g. dynamo_export({model.__name__}(), ...)."
        )
    return (
        f"the model given is {_short_repr(model)} (a {type(model).__name__}); dynamo_export takes an "
        "nn.Module instance, a plain function of tensors, a torch.export.ExportedProgram or an "
        "aten-level torch.fx.GraphModule as its first argument, then the example inputs."
    )


def _numpy_advice(failure: CaptureFailure) -> str:
    return (
        "an example input is a numpy array; give tensors instead: torch.from_numpy(array) "
        "(or torch.as_tensor(array))."
    )


def _meta_advice(failure: CaptureFailure) -> str:
    names = _meta_tensor_names(failure.model)
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return (
        f"the model's weights are on the meta device ({shown}): they hold no data. Materialize "
        "them first (model.to_empty(device='cpu') then model.load_state_dict(...)), or build "
        "the model and inputs under fx2onnx.enable_fake_mode() and give the weights when "
        "saving: program.save(path, model_state=state_dict)."
    )


def _arguments_advice(failure: CaptureFailure) -> str:
    given = [type(a).__name__ for a in failure.args]
    keywords = sorted(failure.kwargs)
    what = f"{len(given)} positional input(s) ({', '.join(given) or 'none'})"
    if keywords:
        what += f" and keyword input(s) {', '.join(keywords)}"
    return (
        f"the example inputs do not fit the model's signature {signature_text(failure.model)}: "
        f"{what} were given ({_binding_error(failure)}). Pass one example per parameter, "
        "positionally or by name."
    )


def _dynamic_spec_advice(failure: CaptureFailure) -> str:
    signature = signature_text(failure.model)
    names = f" {signature}" if signature else ""
    return (
        "ExportOptions(dynamic_shapes=...) does not mirror the inputs: give a dict keyed by "
        f"forward's parameter names{names} (or a tuple in their order), each value a "
        "{dim index: torch.export.Dim('name')} for a tensor or None for a static input; "
        "or dynamic_shapes=True to make every dim dynamic."
    )


def _cache_advice(failure: CaptureFailure) -> str:
    return (
        f"the model returns a transformers cache ({_unknown_output_type(failure)}) as past_key_values. "
        "Export without it: model.config.use_cache = False (or pass use_cache=False as an input); "
        "or, to export the cache, give past_key_values as an example input so that the exporter "
        "maps the cache to ONNX inputs and outputs."
    )


def _unknown_output_advice(failure: CaptureFailure) -> str:
    return (
        f"the model returns a {_unknown_output_type(failure)}, which torch.export cannot flatten: "
        "return its tensors (a tuple, list or dict), or register the class with "
        "torch.utils._pytree.register_pytree_node (or torch.export.register_dataclass)."
    )


def _constraints_advice(failure: CaptureFailure) -> str:
    return (
        "a dim marked dynamic is fixed or tied to another dim by the model's code (see the "
        "lines above and the suggested fixes): make that dim static, define it from the other "
        "Dim (e.g. Dim('c') -> b), or use torch.export.Dim.AUTO (dynamic_shapes=True does) "
        "to let torch.export decide."
    )


def _data_dependent_advice(failure: CaptureFailure) -> str:
    branch = value_branch(failure.model, failure.error)
    if branch is not None and branch.held:
        return held_value_advice(branch)
    where = f" at {branch}" if branch is not None else " (if x.sum() > 0, int(x.max()), .item())"
    return (
        f"a Python branch or size depends on a tensor's values{where}; write the branch with torch.cond or "
        "torch.where, or state the fact with torch._check(...)."
    )


def _real_data_advice(failure: CaptureFailure) -> str:
    return (
        "forward() calls something that needs real tensor data (data_ptr(), .numpy(), .tolist(), "
        "a C extension); move that call out of forward() or wrap it in a "
        "torch.library.custom_op with a fake implementation."
    )


def _fake_mode_advice(failure: CaptureFailure) -> str:
    return (
        "create the model and all its example inputs inside one `with fx2onnx.enable_fake_mode() "
        "as fake_context:` block and export with ExportOptions(fake_context=fake_context); or "
        "export real tensors without a fake context."
    )


def _versions_in_use(model: Any) -> dict[str, str]:
    versions = {"torch": torch.__version__.split("+")[0]}
    if (transformers := transformers_version(model)) is not None:
        versions["transformers"] = transformers
    return versions


def _keyword_inputs_advice(failure: CaptureFailure) -> str | None:
    """What to say of example inputs that land in forward's **kwargs."""
    try:
        signature = capture_signature(failure.model, failure.kwargs)
        parameters = inspect.signature(_forward_of(failure.model)).parameters
    except (TypeError, ValueError):
        return None
    if signature is None:
        return None
    extra = [name for name in failure.kwargs if name not in parameters]
    if "past_key_values" in extra and "cache" in parameters:
        return "pass the cache as cache= (forward's name for it since transformers 5.24) instead of the deprecated past_key_values="
    return f"pass {', '.join(extra)} under a parameter name of forward if it has one (they land in its **kwargs)"


def _torch_internal_advice(failure: CaptureFailure) -> str:
    frame = _torch_frame(failure)
    torch_parent = os.path.dirname(os.path.dirname(torch.__file__))
    where = f" ({os.path.relpath(frame.filename, torch_parent)}:{frame.lineno})" if frame else ""
    steps = []
    keyword = _keyword_inputs_advice(failure)
    if keyword:
        steps.append(keyword)
    if failure.dynamic_shapes not in (None, False):
        steps.append("capture with static shapes (ExportOptions(dynamic_shapes=False)) to see whether the dynamic-shapes spec is what trips it")
    used = _versions_in_use(failure.model)
    tested = {name: TESTED_WITH[name] for name in used}
    if used != tested:
        pins = " ".join(f"{name}=={version}" for name, version in tested.items())
        steps.append(f"install the versions fx2onnx is tested with (pip install {pins}) or upgrade fx2onnx")
    in_use = ", ".join(f"{name} {version}" for name, version in used.items())
    todo = "; or ".join(steps) + ". If none helps, report" if steps else "Report"
    return (
        f"torch.export failed one of its own checks{where}, not a line of your code ({in_use}): "
        f"{todo} the failure with its SARIF report."
    )


def _generic_advice(failure: CaptureFailure) -> str:
    return (
        "torch.export could not trace forward(); fix the line of your code the report points "
        "at (the log holds the full traceback of both capture modes), or capture the model "
        "with torch.export.export yourself and pass the ExportedProgram."
    )


# The table: the first kind that matches gives the hint. Causes read from the inputs and the
# model come first: they are certain, while the error text only suggests.
HINTS: tuple[Hint, ...] = (
    Hint("not-a-model", lambda f: f.model is not UNKNOWN_MODEL and not _is_model(f.model), _not_a_model_advice),
    Hint("numpy-input", _has_numpy_input, _numpy_advice),
    Hint("meta-weights", _has_meta_weights, _meta_advice),
    Hint("argument-count", _wrong_arguments, _arguments_advice),
    Hint("fake-mode-use", _contains("fake_context", "enable_fake_mode()"), _fake_mode_advice),
    Hint("constraints-violated", _contains("Constraints violated"), _constraints_advice),
    Hint("dynamic-shapes-spec", _bad_dynamic_spec, _dynamic_spec_advice),
    Hint("cache-output", _is_cache_output, _cache_advice),
    Hint("unknown-output-type", lambda f: _unknown_output_type(f) is not None, _unknown_output_advice),
    Hint("inside-torch-export", _inside_torch_export, _torch_internal_advice),
    Hint("data-dependent", _contains(*DATA_DEPENDENT), _data_dependent_advice),
    Hint(
        "needs-real-data",
        _contains("data pointer", "data_ptr", ".numpy()", "Cannot access storage", "FakeTensor", "fake tensor"),
        _real_data_advice,
    ),
    Hint("untraceable", lambda f: True, _generic_advice),
)


def classify(failure: CaptureFailure) -> Hint:
    """The hint table's entry for this failure (the last entry matches everything)."""
    for hint in HINTS:
        try:
            if hint.matches(failure):
                return hint
        except Exception:  # noqa: BLE001 - a probe of the user's objects must not hide the error
            continue
    return HINTS[-1]


def capture_hint(failure: CaptureFailure | BaseException) -> str:
    """What to change for this capture failure, in one or two sentences."""
    if isinstance(failure, BaseException):
        failure = CaptureFailure(failure)
    # A library's model is fixed by a config flag or an input, named by the library's own table.
    specific = None if failure.model is UNKNOWN_MODEL else library_hint(failure.model, failure.error)
    return specific or classify(failure).advice(failure)


# -- the message ------------------------------------------------------------------------------

_MAX_LINES = 12
_MAX_LINE = 400
# Where the explanation of a torch.export error ends: its traceback and boilerplate.
_STOP_AT = ("User stack:", "User Stack", "from user code:", "Traceback (most recent call last)", "The error above occurred", "For C++ stack trace")


def explain(error: BaseException) -> str:
    """`Type: message` keeping the lines that explain the cause: the first paragraph
    (e.g. each violated constraint), the cause of a failed guard and torch.export's
    suggested fixes, without the user stack, tracebacks and pointers to other tools."""
    lines = str(error).strip().splitlines()
    kept: list[str] = []
    paragraph_ended = False
    in_fixes = False
    for line in lines:
        stripped = line.strip()
        if any(stripped.startswith(stop) for stop in _STOP_AT):
            in_fixes = False
            paragraph_ended = True
            continue
        if stripped.startswith("Caused by:"):  # a guard's cause: the user's expression
            kept.append(line.rstrip()[:_MAX_LINE])
            continue
        if stripped.startswith("Suggested fixes"):
            in_fixes = True
            kept.append(stripped)
            continue
        if not stripped:
            in_fixes = False
            paragraph_ended = paragraph_ended or bool(kept)
            continue
        if in_fixes or not paragraph_ended:
            kept.append(line.rstrip()[:_MAX_LINE])
    if len(kept) > _MAX_LINES:
        kept = kept[:_MAX_LINES] + ["  ..."]
    text = "\n".join(kept) or "(no message)"
    return f"{type(error).__name__}: {text}"


__all__ = ["HINTS", "CaptureFailure", "Hint", "capture_hint", "classify", "explain", "signature_text"]
