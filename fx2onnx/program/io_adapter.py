"""Map PyTorch-style inputs and outputs onto the flat lists the ONNX graph takes and gives.

Inputs: pytree-flatten `(args, kwargs)` in the order the program was exported with,
check the structure, drop `None` and the Python scalars that were specialized into the
graph (checking they still have the exported value), turn complex tensors into real ones.
Outputs: pick the user's outputs among the graph outputs, restore complex tensors, and
rebuild the model's output structure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import onnx_ir as ir
import torch
import torch.utils._pytree as pytree

from dispatcher import torch_dtype_to_onnx
from fx2onnx.capture.fake_mode import is_fake

from fx2onnx.capture.default_arguments import TensorDefaults
from fx2onnx.errors import UnsupportedInputError
from fx2onnx.program.tied_sizes import TiedSizes
from fx2onnx.translate.io_slots import InputSlot, OutputSlot
from fx2onnx.translate.tensor_data import real_view


class InputAdapter:
    def __init__(
        self,
        in_spec: pytree.TreeSpec | None,
        slots: Sequence[InputSlot],
        tensor_defaults: TensorDefaults | None = None,
        tied_sizes: TiedSizes | None = None,
    ) -> None:
        self.in_spec = in_spec
        self.slots = list(slots)
        # forward's tensor defaults exported as inputs: fed when the caller leaves them out
        self.tensor_defaults = tensor_defaults
        # dims of several inputs the export tied together (one symbol, a sum of others)
        self.tied_sizes = tied_sizes

    def flatten(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
        if self.in_spec is None:
            leaves, _ = pytree.tree_flatten(list(args) + list(kwargs.values()))
            return leaves
        if self.tensor_defaults is not None:
            args, kwargs = self.tensor_defaults.complete(args, kwargs, self.in_spec.child(0).num_children)
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

    def apply(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], expected: Sequence[ir.Value] | None = None
    ) -> list[torch.Tensor]:
        """The flat ONNX inputs for these PyTorch inputs; with ``expected`` (the ONNX
        graph's inputs) each is checked against its dtype, rank and static sizes first,
        and then the sizes the export tied across inputs."""
        leaves = self.flatten(args, kwargs)
        if len(leaves) != len(self.slots):
            raise UnsupportedInputError(
                f"Expected {len(self.slots)} input leaves, got {len(leaves)}."
            )
        onnx_inputs: list[torch.Tensor] = []
        names: list[str] = []
        for slot, leaf in zip(self.slots, leaves):
            if slot.is_onnx_input:
                value = expected[len(onnx_inputs)] if expected is not None and len(onnx_inputs) < len(expected) else None
                name = value.name if value is not None else slot.name
                if leaf is None or (isinstance(leaf, torch.Tensor) and is_fake(leaf)):
                    what = "None" if leaf is None else "a tensor without data (meta device or FakeTensor)"
                    raise UnsupportedInputError(
                        f"Input '{name}' is {what}; the program was exported with a tensor there: give a real tensor."
                    )
                if not isinstance(leaf, torch.Tensor):
                    leaf = torch.tensor(leaf)
                fed = real_view(leaf)
                if value is not None:
                    check_input(name, leaf, fed, value)
                onnx_inputs.append(fed)
                names.append(name)
            elif not _same_constant(slot.constant, leaf):
                raise UnsupportedInputError(_changed_constant_message(slot, leaf))
        if expected is not None and self.tied_sizes is not None:
            self.tied_sizes.check(names, onnx_inputs)
        return onnx_inputs


def check_input(name: str, given: torch.Tensor, fed: torch.Tensor, value: ir.Value) -> None:
    """An input that does not fit the ONNX graph input it feeds is an UnsupportedInputError
    saying which input, which dim, what was exported and what to do (before onnxruntime
    sees it)."""
    if value.dtype is not None and torch_dtype_to_onnx(fed.dtype) != value.dtype:
        raise UnsupportedInputError(
            f"Input '{name}' is {given.dtype}; the program was exported with {_torch_name(value.dtype)} there. "
            f"Convert it (e.g. .to(torch.{_torch_name(value.dtype)})), or export with an example of this dtype."
        )
    if value.shape is None:
        return
    exported = list(value.shape)
    if len(exported) != fed.dim():
        raise UnsupportedInputError(
            f"Input '{name}' has {given.dim()} dim(s) {tuple(given.shape)}; the program was exported with "
            f"{len(exported) - (fed.dim() - given.dim())} there. Give a tensor of that rank, or export with one of this rank."
        )
    for index, (dim, size) in enumerate(zip(exported, fed.shape)):
        if isinstance(dim, int) and dim != size:
            raise UnsupportedInputError(
                f"Input '{name}' has size {size} in dim {index}; the program was exported with the static size {dim} "
                "there. Give that size, or export with this dim dynamic (ExportOptions(dynamic_shapes=True), or a "
                "dynamic_shapes spec that names it)."
            )


def _torch_name(dtype: ir.DataType) -> str:
    try:
        return str(dtype.numpy().name)
    except (TypeError, ValueError, NotImplementedError):  # types numpy lacks (bfloat16, float8)
        return dtype.name.lower()


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


def _changed_constant_message(slot: InputSlot, given: Any) -> str:
    """What to do when a non-tensor input has another value than at export."""
    exported = slot.constant
    advice = "export again with the new value"
    if isinstance(exported, (bool, int, float)) and not isinstance(given, (str, bytes)):
        advice += ", or export with a tensor there to keep it an input"
    return (
        f"Input '{slot.name}' was specialized to {exported!r} ({type(exported).__name__}) at export, but {given!r} was given. "
        f"A non-tensor input is baked into the ONNX graph with its exported value: give {exported!r} again, "
        f"or {advice} (e.g. fx2onnx.dynamo_export(..., {slot.name}={given!r}))."
    )


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
