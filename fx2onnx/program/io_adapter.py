"""Map PyTorch-style inputs and outputs onto the flat lists the ONNX graph takes and gives.

Inputs: pytree-flatten `(args, kwargs)` in the order the program was exported with,
check the structure, drop `None` and the Python scalars that were specialized into the
graph (checking they still have the exported value), turn complex tensors into real ones.
Outputs: pick the user's outputs among the graph outputs, restore complex tensors, and
rebuild the model's output structure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from fx2onnx.capture.containers import is_cache_type, is_encoder_decoder_cache_type
from fx2onnx.errors import UnsupportedInputError
from fx2onnx.translate.tensor_data import real_view


@dataclass(frozen=True)
class InputSlot:
    """One leaf of the flattened inputs: fed to ONNX, or a value baked into the graph."""

    name: str
    is_onnx_input: bool
    constant: Any = None


@dataclass(frozen=True)
class OutputSlot:
    """One leaf of the model's outputs: an ONNX output index, or a constant."""

    onnx_index: int | None
    is_complex: bool = False
    constant: Any = None
    # int/float/bool for outputs that are symbolic sizes in PyTorch (a 0-d tensor in ONNX)
    python_type: type | None = None


@dataclass(frozen=True)
class MutationOutput:
    """A graph output that carries the new value of a mutated user input or buffer.

    ``kind`` is "user_input" or "buffer"; ``target`` the input's name or the buffer's
    attribute path (``bn.running_mean``). The ONNX output is named ``<target>.mutated``:
    ONNX needs it distinct from the input or initializer of the same name.
    """

    kind: str
    target: str
    onnx_name: str
    onnx_index: int


MUTATION_SUFFIX = ".mutated"


class InputAdapter:
    def __init__(self, in_spec: pytree.TreeSpec | None, slots: Sequence[InputSlot]) -> None:
        self.in_spec = in_spec
        self.slots = list(slots)

    def flatten(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
        if self.in_spec is None:
            leaves, _ = pytree.tree_flatten(list(args) + list(kwargs.values()))
            return leaves
        kwargs_spec = self.in_spec.child(1) if self.in_spec.num_children == 2 else None
        if kwargs_spec is not None and kwargs_spec.context is not None:
            expected = list(kwargs_spec.context)
            if set(expected) != set(kwargs):
                raise UnsupportedInputError(
                    f"Model inputs incompatible with the format that was exported: keyword arguments "
                    f"{sorted(kwargs)} were given, the program was exported with {sorted(expected)}."
                )
            kwargs = {key: kwargs[key] for key in expected}
        leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        if spec != self.in_spec:
            raise UnsupportedInputError(
                "Model inputs incompatible with the format that was exported (* is one tensor, scalar or None).\n"
                f"  exported: {describe_inputs(self.in_spec)}\n  given:    {describe_inputs(spec)}\n"
                "Pass inputs with the same nesting (tuples, lists, dicts, None) as at export."
            )
        return leaves

    def leaf_named(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """The given input leaf that the graph input ``name`` was exported from."""
        leaves = self.flatten(args, kwargs)
        for slot, leaf in zip(self.slots, leaves):
            if slot.name == name:
                return leaf
        raise KeyError(f"The program has no input named '{name}'.")

    def apply(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
        leaves = self.flatten(args, kwargs)
        if len(leaves) != len(self.slots):
            raise UnsupportedInputError(
                f"Expected {len(self.slots)} input leaves, got {len(leaves)}."
            )
        onnx_inputs: list[torch.Tensor] = []
        for slot, leaf in zip(self.slots, leaves):
            if slot.is_onnx_input:
                if not isinstance(leaf, torch.Tensor):
                    leaf = torch.tensor(leaf)
                onnx_inputs.append(real_view(leaf))
            elif not _same_constant(slot.constant, leaf):
                raise UnsupportedInputError(
                    f"Input '{slot.name}' was specialized to {slot.constant!r} at export, "
                    f"but {leaf!r} was given. Python scalars are baked into the ONNX graph; "
                    "export again with the new value, or pass it as a tensor."
                )
        return onnx_inputs


def describe_inputs(spec: pytree.TreeSpec) -> str:
    """The `(args, kwargs)` structure as Python-like text: `args=(*, [*, *]), kwargs={'mask': *}`."""
    if spec.type is tuple and spec.num_children == 2 and spec.child(1).type is dict:
        args = [describe_structure(spec.child(0).child(i)) for i in range(spec.child(0).num_children)]
        return f"args=({', '.join(args)}), kwargs={describe_structure(spec.child(1))}"
    return describe_structure(spec)


def describe_structure(spec: pytree.TreeSpec) -> str:
    """One nested value as Python-like text; `*` is one leaf (a tensor, a scalar or None)."""
    if spec.is_leaf():
        return "*"
    children = [describe_structure(spec.child(i)) for i in range(spec.num_children)]
    if spec.type is tuple:
        return "(" + ", ".join(children) + ("," if len(children) == 1 else "") + ")"
    if spec.type is list:
        return "[" + ", ".join(children) + "]"
    if spec.type is dict:
        return "{" + ", ".join(f"{key!r}: {child}" for key, child in zip(spec.context, children)) + "}"
    return f"{spec.type.__name__}(" + ", ".join(children) + ")"


def _same_constant(expected: Any, given: Any) -> bool:
    if isinstance(given, torch.Tensor) or isinstance(expected, torch.Tensor):
        return False
    return expected == given


def _as_complex(value: torch.Tensor) -> torch.Tensor:
    """A complex tensor from its real form [..., 2] (an empty one too, whose strides
    view_as_complex rejects)."""
    if value.numel() == 0:
        return torch.complex(value[..., 0], value[..., 1])
    return torch.view_as_complex(value.contiguous())


class OutputAdapter:
    def __init__(self, out_spec: pytree.TreeSpec | None, slots: Sequence[OutputSlot]) -> None:
        self.out_spec = out_spec
        self.slots = list(slots)

    def apply(self, onnx_outputs: Sequence[torch.Tensor]) -> Any:
        leaves = []
        for slot in self.slots:
            if slot.onnx_index is None:
                leaves.append(slot.constant)
                continue
            value = onnx_outputs[slot.onnx_index]
            if slot.is_complex:
                value = _as_complex(value)
            elif slot.python_type is not None:
                value = slot.python_type(value.item())
            leaves.append(value)
        if self.out_spec is None:
            return leaves[0] if len(leaves) == 1 else leaves
        return pytree.tree_unflatten(leaves, self.out_spec)

    @staticmethod
    def flatten_torch_outputs(outputs: Any) -> list[Any]:
        leaves, _ = pytree.tree_flatten(outputs)
        return [real_view(leaf) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]


# -- ONNX names of input and output leaves ---------------------------------------------
# The names ONNX Runtime GenAI and Optimum give to KV caches.
PAST_PREFIX = "past_key_values"
PRESENT_PREFIX = "present"
_LAYER_TENSOR_NAMES = {"keys": "key", "values": "value"}


def input_leaf_names(in_spec: pytree.TreeSpec | None) -> list[str | None]:
    """The ONNX name of each input leaf of `(args, kwargs)`, or None where torch.export's
    placeholder name (the parameter's name) is kept: keyword inputs by their keys
    (`attention_mask`), cache tensors as `past_key_values.<layer>.key` / `.value`
    (`.decoder.` / `.encoder.` parts for an encoder-decoder cache)."""
    if in_spec is None:
        return []
    if in_spec.type is tuple and in_spec.num_children == 2 and in_spec.child(1).type is dict:
        names = _leaf_names(in_spec.child(0), None, PAST_PREFIX)
        return names + _leaf_names(in_spec.child(1), None, PAST_PREFIX)
    return _leaf_names(in_spec, None, PAST_PREFIX)


def output_leaf_names(out_spec: pytree.TreeSpec | None) -> list[str | None]:
    """The ONNX name of each output leaf, or None to keep the node's name: fields of
    dict-like outputs by their keys (`logits`), caches as `present.<layer>.key` / `.value`."""
    if out_spec is None:
        return []
    return _leaf_names(out_spec, None, PRESENT_PREFIX)


def _join(parent: str | None, child: Any) -> str | None:
    return None if parent is None else f"{parent}.{child}"


def _child_keys(spec: pytree.TreeSpec) -> list[Any] | None:
    """Readable keys of a container's children: dict keys, named-tuple fields."""
    if isinstance(spec.type, type) and issubclass(spec.type, dict) and isinstance(spec.context, (list, tuple)):
        return list(spec.context)
    fields = getattr(spec.type, "_fields", None)
    if isinstance(fields, tuple) and len(fields) == spec.num_children:
        return list(fields)
    return None


def _leaf_names(spec: pytree.TreeSpec, name: str | None, cache_prefix: str) -> list[str | None]:
    if spec.is_leaf():
        return [name]
    if is_cache_type(spec.type) and _flat_pairs(spec):
        # registered elsewhere (transformers' own exporter) as a flat list of tensors,
        # layer by layer, keys before values; an encoder-decoder's decoder layers first
        parts = [""] if not is_encoder_decoder_cache_type(spec.type) else [".decoder", ".encoder"]
        per_part = spec.num_children // len(parts)
        return [
            f"{cache_prefix}.{(index % per_part) // 2}{parts[index // per_part]}.{('key', 'value')[index % 2]}"
            for index in range(spec.num_children)
        ]
    if is_encoder_decoder_cache_type(spec.type):
        decoder, encoder = spec.child(0), spec.child(1)
        return _cache_leaf_names(decoder, cache_prefix, ".decoder") + _cache_leaf_names(encoder, cache_prefix, ".encoder")
    if is_cache_type(spec.type):
        return _cache_leaf_names(spec, cache_prefix, "")
    keys = _child_keys(spec)
    names: list[str | None] = []
    for index in range(spec.num_children):
        key = keys[index] if keys is not None else index
        child_name = str(key) if name is None and keys is not None else _join(name, key)
        names += _leaf_names(spec.child(index), child_name, cache_prefix)
    return names


def _flat_pairs(spec: pytree.TreeSpec) -> bool:
    """A cache flattened straight to tensors: two per layer (and per side of an
    encoder-decoder cache)."""
    group = 4 if is_encoder_decoder_cache_type(spec.type) else 2
    count = spec.num_children
    return count > 0 and count % group == 0 and all(spec.child(i).is_leaf() for i in range(count))


def _cache_leaf_names(spec: pytree.TreeSpec, prefix: str, part: str) -> list[str | None]:
    """`<prefix>.<layer><part>.key` for each layer's tensors (other tensor state by its attribute)."""
    names: list[str | None] = []
    for layer_index in range(spec.num_children):
        layer = spec.child(layer_index)
        if layer.is_leaf():
            names.append(f"{prefix}.{layer_index}{part}")
            continue
        tensor_names = layer.context[0] if isinstance(layer.context, tuple) and layer.context else ()
        for index in range(layer.num_children):
            attribute = tensor_names[index] if index < len(tensor_names) else str(index)
            base = f"{prefix}.{layer_index}{part}.{_LAYER_TENSOR_NAMES.get(attribute, attribute)}"
            names += _leaf_names(layer.child(index), base, prefix)
    return names
