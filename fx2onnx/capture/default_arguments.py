"""Tensor default arguments (`forward(self, x, b=torch.tensor(1.0))`) stay inputs.

A parameter of forward whose default is a tensor, and that the example inputs leave
out, is exported as a keyword input fed with its default, as the former
`torch.onnx.dynamo_export` did: the ONNX model takes it as an input, and
`ONNXProgram(...)` feeds the default when the caller leaves it out (or takes the
caller's tensor, by keyword or by position).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import inspect

import torch

from fx2onnx.capture.dynamic_dims.signature import forward_signature
from fx2onnx.capture.fake_mode import fake_copy
from fx2onnx.options import ONNXFakeContext


@dataclass(frozen=True)
class TensorDefaults:
    """The tensor defaults that became inputs, and forward's positional parameter names
    (to read a caller's positional tensor as the keyword input it was exported as)."""

    defaults: Mapping[str, torch.Tensor]
    positional_names: tuple[str, ...]

    def complete(self, args: Sequence[Any], kwargs: Mapping[str, Any], exported_positional: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The caller's inputs in the exported form: positional tensors past the exported
        ones moved to their keyword, omitted defaults filled in."""
        args, kwargs = tuple(args), dict(kwargs)
        extra = args[exported_positional:]
        names = self.positional_names[exported_positional:exported_positional + len(extra)]
        if extra and len(names) == len(extra) and all(name in self.defaults and name not in kwargs for name in names):
            args = args[:exported_positional]
            kwargs.update(zip(names, extra))
        for name, default in self.defaults.items():
            kwargs.setdefault(name, default)
        return args, kwargs


def with_tensor_defaults(
    model: Any, args: Sequence[Any], kwargs: Mapping[str, Any], fake_context: ONNXFakeContext | None
) -> tuple[dict[str, Any], TensorDefaults | None]:
    """``kwargs`` with every omitted tensor default added (a FakeTensor of the export's
    fake mode when there is one), and what was added."""
    signature = forward_signature(model)
    if signature is None:
        return dict(kwargs), None
    try:
        bound = signature.bind_partial(*args, **kwargs)
    except TypeError:  # inputs that do not fit forward: the capture reports it with a hint
        return dict(kwargs), None
    defaults = {
        name: parameter.default
        for name, parameter in signature.parameters.items()
        if name not in bound.arguments
        and isinstance(parameter.default, torch.Tensor)
        and parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    if not defaults:
        return dict(kwargs), None
    example = dict(defaults)
    if fake_context is not None:
        example = {name: fake_copy(fake_context.fake_mode, tensor, static=True) for name, tensor in defaults.items()}
    positional = tuple(
        name for name, parameter in signature.parameters.items() if parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    )
    return {**kwargs, **example}, TensorDefaults(defaults, positional)


__all__ = ["TensorDefaults", "with_tensor_defaults"]
