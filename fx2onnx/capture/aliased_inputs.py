"""Example inputs that share storage are captured as the independent inputs they are at run time.

`model(x, x)` (self-attention, `(ids, ids)` as labels) and views of one tensor are common
examples. torch.export treats inputs that alias as one value: `lambda a, b: a + b`
exported from `(x, x)` reads `b` twice and ignores `a`. The inputs of an ONNX model never
share memory, so the capture gets independent copies of every example input that shares
storage with another one or with a parameter or buffer of the model; the user's tensors
are left as they are. When the model updates one of them in place, PyTorch sees the
update through the other and the ONNX model cannot: the export says so and what to do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from diagnostics import DiagnosticContext, Level, rules
from fx2onnx.capture.dynamic_dims.check import inputs_in_input_order
from fx2onnx.capture.dynamic_dims.signature import forward_signature


@dataclass(frozen=True)
class AliasGroup:
    """Inputs (and weights) that share one storage in the example.

    Attributes:
        inputs: the names of the example inputs, in input order (`q`, `cache[0]`).
        paths: their pytree key paths in `(args, kwargs)`, in the same order.
        weights: names of the model's parameters and buffers on that storage.
    """

    inputs: tuple[str, ...]
    paths: tuple[tuple[Any, ...], ...]
    weights: tuple[str, ...] = ()

    def describe(self) -> str:
        names = [f"'{name}'" for name in self.inputs] + [f"the model's '{name}'" for name in self.weights]
        return ", ".join(names[:-1]) + " and " + names[-1]


@dataclass(frozen=True)
class IndependentExample:
    """The example inputs the capture gets, and the groups of inputs that aliased."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    groups: tuple[AliasGroup, ...]


def independent_example(model: torch.nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any]) -> IndependentExample:
    """``args`` and ``kwargs`` with every tensor that shares storage with an earlier input
    (or with a weight of ``model``) replaced by a copy of its own."""
    leaves, spec = pytree.tree_flatten_with_path((tuple(args), dict(kwargs)))
    weights_by_storage: dict[Any, list[str]] = {}
    for name, weight in (*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)):
        key = _storage_key(weight)
        if key is not None:
            weights_by_storage.setdefault(key, []).append(name)
    by_storage: dict[Any, list[int]] = {}
    for index, (_, leaf) in enumerate(leaves):
        key = _storage_key(leaf)
        if key is not None:
            by_storage.setdefault(key, []).append(index)
    paths = [path for path, _ in leaves]
    names = _leaf_names(model, paths)
    values = [leaf for _, leaf in leaves]
    groups: list[AliasGroup] = []
    for key, indices in by_storage.items():
        weights = tuple(weights_by_storage.get(key, ()))
        if len(indices) < 2 and not weights:
            continue
        # the first input keeps its tensor unless a weight shares it
        for index in indices[0 if weights else 1:]:
            values[index] = _copy(values[index])
        groups.append(AliasGroup(tuple(names[i] for i in indices), tuple(paths[i] for i in indices), weights))
    if not groups:
        return IndependentExample(tuple(args), dict(kwargs), ())
    new_args, new_kwargs = pytree.tree_unflatten(values, spec)
    return IndependentExample(tuple(new_args), dict(new_kwargs), tuple(groups))


def report_aliased_inputs(
    context: DiagnosticContext,
    program: torch.export.ExportedProgram,
    groups: Sequence[AliasGroup],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> None:
    """A note per group of aliased example inputs; a warning (a Python warning at the
    export's end, as every warning) where the model, captured from ``args`` and
    ``kwargs`` of the same structure, updates one of them in place."""
    if not groups:
        return
    mutated = _mutated_paths(program, args, kwargs)
    for group in groups:
        updated = [name for name, path in zip(group.inputs, group.paths) if path in mutated]
        updated += [name for name in group.weights if name in program.graph_signature.buffers_to_mutate.values()]
        if not updated:
            consequence = "the export took them as independent inputs, as the ONNX model's inputs are at run time."
            context.record(rules.ALIASED_EXAMPLE_INPUTS, Level.NOTE, inputs=group.describe(), consequence=consequence)
            continue
        context.record(
            rules.ALIASED_EXAMPLE_INPUTS, Level.WARNING, inputs=group.describe(),
            consequence=(
                f"the model updates {', '.join(map(repr, updated))} in place. In PyTorch that update is seen through "
                "the others; the inputs of an ONNX model never share memory, so the exported model computes what the "
                "model does on independent tensors (it was captured from independent copies). Export from independent "
                "example inputs (e.g. `.clone()` one of them) if that is what you mean; if the model relies on the "
                "aliasing, pass one tensor and derive the other from it inside the model."
            ),
        )


def _mutated_paths(program: torch.export.ExportedProgram, args: Sequence[Any], kwargs: Mapping[str, Any]) -> set[tuple[Any, ...]]:
    """The key paths of the inputs that the program updates in place."""
    signature = program.graph_signature
    mutated_names = set(signature.user_inputs_to_mutate.values())
    user_specs = [spec for spec in signature.input_specs if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    paths = [path for path, _ in pytree.tree_flatten_with_path(inputs_in_input_order(program, args, kwargs))[0]]
    return {path for spec, path in zip(user_specs, paths) if getattr(spec.arg, "name", None) in mutated_names}


def _storage_key(value: Any) -> Any:
    """What identifies the storage of a tensor (views share it), or None."""
    if not isinstance(value, torch.Tensor) or value.layout is not torch.strided:
        return None
    try:
        storage = value.untyped_storage()
    except (RuntimeError, NotImplementedError):  # tensors without storage (functional wrappers)
        return None
    return (value.device, storage._cdata)


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    copy = tensor.detach().clone()
    return copy.requires_grad_(tensor.requires_grad) if tensor.is_leaf else copy


def _leaf_names(model: torch.nn.Module, paths: Sequence[tuple[Any, ...]]) -> list[str]:
    """Each leaf's name as the user reads it: its parameter's name and the path inside it."""
    signature = forward_signature(model)
    positional = [
        name for name, parameter in (signature.parameters.items() if signature else ())
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
    ]
    names = []
    for path in paths:
        top, rest = path[1], path[2:]
        if path[0] == pytree.SequenceKey(0):
            index = top.idx
            head = positional[index] if index < len(positional) else f"args[{index}]"
        else:
            head = str(top.key)
        names.append(head + pytree.keystr(rest))
    return names


__all__ = ["AliasGroup", "IndependentExample", "independent_example", "report_aliased_inputs"]
