"""The command line's model and example inputs: import the user's code, build the model,
make or load the inputs, and bind them to the model's parameters."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fx2onnx.cli.specs import DynamicSpec, InputSpec, ModelSpec, UsageError, make_example
from fx2onnx.capture.dynamic_dims.signature import bound_arguments
from fx2onnx.capture.hints import signature_text


class ModelBuildError(RuntimeError):
    """The user's code raised while the model was imported or built (exit code 1)."""


@contextmanager
def _importable_from(folder: Path) -> Iterator[None]:
    """The model file's folder on sys.path while it loads, so that it imports its siblings."""
    entry = str(folder)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        if entry in sys.path:
            sys.path.remove(entry)


def import_source(spec: ModelSpec) -> Any:
    """The module named by `spec` (a .py file or a dotted name), imported."""
    if spec.is_file:
        path = Path(spec.source).expanduser().resolve()
        if not path.is_file():
            raise UsageError(f"model file '{spec.source}' does not exist.")
        module_name = f"fx2onnx_cli_model_{path.stem}"
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise UsageError(f"model file '{spec.source}' cannot be loaded as Python.")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module  # dataclasses and pickling look modules up here
        with _importable_from(path.parent):
            try:
                loader_spec.loader.exec_module(module)
            except Exception as error:
                sys.modules.pop(module_name, None)
                raise ModelBuildError(f"importing '{spec.source}' failed: {type(error).__name__}: {error}") from error
        return module
    if importlib.util.find_spec(spec.source.split(".")[0]) is None:
        raise UsageError(f"no module named '{spec.source}' (is its package installed or on PYTHONPATH?).")
    try:
        return importlib.import_module(spec.source)
    except ModuleNotFoundError as error:
        raise UsageError(f"module '{spec.source}' cannot be imported: {error}.") from error
    except Exception as error:
        raise ModelBuildError(f"importing '{spec.source}' failed: {type(error).__name__}: {error}") from error


def resolve_attribute(module: Any, spec: ModelSpec) -> Any:
    target = module
    for part in spec.attribute.split("."):
        if not hasattr(target, part):
            names = sorted(n for n in dir(module) if not n.startswith("_"))[:20]
            raise UsageError(
                f"'{spec.source}' has no '{spec.attribute}'; it defines: {', '.join(names) or 'nothing public'}."
            )
        target = getattr(target, part)
    return target


def required_parameter_count(function: Any) -> int:
    """How many parameters a call must give (0 when Python cannot tell)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return 0
    return sum(
        1 for p in parameters
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    )


@dataclass
class BuiltModel:
    """The model, and example inputs its factory may have returned along with it."""

    model: Any
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def build_model(target: Any, spec: ModelSpec) -> BuiltModel:
    """A class is instantiated with no arguments; a function with no required parameter
    is a factory and is called (it may return the model, or `(model, args)` or
    `(model, args, kwargs)`); a module instance or a function of tensors is the model."""
    if isinstance(target, torch.nn.Module):
        return BuiltModel(target)
    if not callable(target):
        raise UsageError(
            f"'{spec.attribute}' is a {type(target).__name__}, not a model: name an nn.Module class "
            "or instance, a factory function, or a function of tensors."
        )
    is_class = isinstance(target, type)
    if not is_class and required_parameter_count(target) > 0:
        return BuiltModel(target)  # a plain function of tensors is the model itself
    if is_class and required_parameter_count(target) > 0:
        raise UsageError(
            f"{target.__name__}{inspect.signature(target)} needs arguments; add a factory function "
            "with none (def make_model(): return ...) and name it instead."
        )
    try:
        built = target()
    except Exception as error:
        raise ModelBuildError(f"{spec.attribute}() raised {type(error).__name__}: {error}") from error
    if isinstance(built, tuple) and built and callable(built[0]) and len(built) in (2, 3):
        args = built[1] if isinstance(built[1], (tuple, list)) else (built[1],)
        kwargs = dict(built[2]) if len(built) == 3 else {}
        return BuiltModel(built[0], tuple(args), kwargs)
    if not callable(built):
        raise UsageError(f"{spec.attribute}() returned a {type(built).__name__}, not a model.")
    return BuiltModel(built)


def load_inputs_file(path: Path) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Example inputs saved with torch.save: a tuple/list of args, a dict of kwargs, a
    single tensor, or {"args": (...), "kwargs": {...}}."""
    try:
        data = torch.load(path, weights_only=True)
    except Exception as error:
        raise UsageError(f"--inputs-file '{path}' cannot be read by torch.load: {error}") from error
    if isinstance(data, dict) and set(data) <= {"args", "kwargs"} and data:
        return tuple(data.get("args", ())), dict(data.get("kwargs", {}))
    if isinstance(data, dict):
        return (), dict(data)
    if isinstance(data, (tuple, list)):
        return tuple(data), {}
    return (data,), {}


def make_inputs(specs: Sequence[InputSpec], generator: torch.Generator | None = None) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Positional specs become args in order, named ones kwargs."""
    args = tuple(make_example(s, generator=generator) for s in specs if s.name is None)
    kwargs = {s.name: make_example(s, generator=generator) for s in specs if s.name is not None}
    return args, kwargs


def bind_inputs(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The inputs by parameter name; a UsageError that shows the signature if they do not fit."""
    target = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        inspect.signature(target).bind(*args, **kwargs)
    except (TypeError, ValueError) as error:
        if isinstance(error, ValueError):  # no signature to check against: torch.export will tell
            return {}
        given = f"{len(args)} positional input(s)" + (f" and {', '.join(kwargs)}" if kwargs else "")
        raise UsageError(
            f"the inputs do not fit {signature_text(model)}: {given} given ({error}). "
            "Give one --input per parameter, named after it (--input x=2x16:float32)."
        ) from error
    return bound_arguments(model, args, kwargs) or {}


def dynamic_shapes_spec(specs: Sequence[DynamicSpec], named_inputs: dict[str, Any]) -> dict[str, Any]:
    """A torch.export dynamic-shapes dict from the per-input specs; dims that share a name
    share one `Dim`, so torch.export knows they are equal."""
    dims_by_name: dict[str, Any] = {}
    spec: dict[str, Any] = {}
    for item in specs:
        value = named_inputs.get(item.input_name)
        if not isinstance(value, torch.Tensor):
            known = ", ".join(n for n, v in named_inputs.items() if isinstance(v, torch.Tensor))
            raise UsageError(
                f"--dynamic {item.input_name}=...: the model has no tensor input '{item.input_name}' "
                f"(tensor inputs: {known or 'none'})."
            )
        per_input = spec.setdefault(item.input_name, {})
        for index, name in item.dims.items():
            if index >= value.dim():
                raise UsageError(
                    f"--dynamic {item.input_name}={index}: '{item.input_name}' has {value.dim()} dims "
                    f"(shape {list(value.shape)})."
                )
            if name is None:
                per_input[index] = torch.export.Dim.AUTO
            else:
                per_input[index] = dims_by_name.setdefault(name, torch.export.Dim(name))
    # Inputs not named stay static: torch.export wants every parameter in a dict spec.
    return {name: spec.get(name) for name in named_inputs}


__all__ = [
    "BuiltModel", "ModelBuildError", "bind_inputs", "build_model", "dynamic_shapes_spec",
    "import_source", "load_inputs_file", "make_inputs", "required_parameter_count", "resolve_attribute",
]
