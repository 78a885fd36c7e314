"""Which FX placeholders become ONNX inputs or initializers, and which outputs are whose.

Reads torch.export's graph signature (or, for a bare GraphModule, the graph itself) and
produces the input/output slots of the IO adapters and the lifted weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.export.graph_signature import InputKind, OutputKind

from dispatcher.fx_nodes import placeholder_nodes
from fx2onnx.capture.dynamic_dims.names import dim_name
from fx2onnx.translate.fake_metadata import SymbolNamer
from fx2onnx.translate.io_names import input_leaf_names, output_leaf_names
from fx2onnx.translate.io_slots import InputSlot

_TENSOR_LIKE = (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)


@dataclass
class GraphIO:
    lifted_tensors: dict[str, tuple[str, torch.Tensor]] = field(default_factory=dict)
    input_slots: list[InputSlot] = field(default_factory=list)
    in_spec: pytree.TreeSpec | None = None
    out_spec: pytree.TreeSpec | None = None
    # for each FX output leaf: "user", or the kind and target of a mutation output
    output_roles: list[tuple[str, str | None]] = field(default_factory=list)
    specialized_scalars: list[tuple[str, Any]] = field(default_factory=list)
    # placeholders of torch.export's effect tokens: no ONNX inputs (see passes/effect_tokens)
    effect_tokens: set[str] = field(default_factory=set)
    # placeholder name -> ONNX input name, where it differs (cache tensors, keyword inputs)
    input_names: dict[str, str] = field(default_factory=dict)
    # ONNX name of each user output leaf, None to keep the producing node's name
    output_names: list[str | None] = field(default_factory=list)

    def onnx_input_name(self, placeholder: str) -> str:
        return self.input_names.get(placeholder, placeholder)


def _output_args(graph_module: torch.fx.GraphModule) -> Any:
    return next(n for n in reversed(graph_module.graph.nodes) if n.op == "output").args[0]


def describe_exported_program(program: torch.export.ExportedProgram) -> GraphIO:
    io = GraphIO(in_spec=program.call_spec.in_spec, out_spec=program.call_spec.out_spec)
    by_name = {n.name: n for n in placeholder_nodes(program.graph_module)}
    for spec in program.graph_signature.input_specs:
        node = by_name[spec.arg.name]
        if spec.kind == InputKind.USER_INPUT:
            meta = node.meta.get("val")
            if isinstance(meta, _TENSOR_LIKE):
                io.input_slots.append(InputSlot(node.name, True))
            else:
                io.input_slots.append(InputSlot(node.name, False, meta))
                if meta is not None:
                    io.specialized_scalars.append((node.name, meta))
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            target = spec.target
            tensor = program.state_dict.get(target)
            if tensor is None:
                tensor = program.constants[target]
            io.lifted_tensors[node.name] = (target, tensor)
        elif spec.kind == InputKind.TOKEN:
            io.effect_tokens.add(node.name)
        else:
            raise NotImplementedError(
                f"Graph input '{node.name}' of kind {spec.kind.name} is not supported yet."
            )
    _name_leaves(io)
    for spec in program.graph_signature.output_specs:
        if spec.kind == OutputKind.USER_OUTPUT:
            io.output_roles.append(("user", None))
        else:
            io.output_roles.append((spec.kind.name.lower(), spec.target))
    return io


def _name_leaves(io: GraphIO) -> None:
    """ONNX names of the inputs and outputs from the model's input and output structure."""
    names = input_leaf_names(io.in_spec)
    if len(names) == len(io.input_slots):
        taken = {slot.name for slot in io.input_slots}
        for slot, name in zip(io.input_slots, names):
            if name is not None and name != slot.name and name not in taken:
                io.input_names[slot.name] = name
                taken.add(name)
    io.output_names = output_leaf_names(io.out_spec)


def describe_graph_module(graph_module: torch.fx.GraphModule) -> GraphIO:
    io = GraphIO()
    for node in placeholder_nodes(graph_module):
        meta = node.meta.get("val")
        io.input_slots.append(InputSlot(node.name, isinstance(meta, _TENSOR_LIKE), None if isinstance(meta, _TENSOR_LIKE) else meta))
    outputs = _output_args(graph_module)
    # functionalize_graph_module puts the new values of mutated inputs first
    mutated = graph_module.meta.get("fx2onnx_input_mutations")
    if mutated is not None:
        io.output_roles = [("user_input_mutation", name) for name in mutated]
        outputs = outputs[1]
    leaves, io.out_spec = pytree.tree_flatten(outputs)
    io.output_roles += [("user", None)] * len(leaves)
    return io


def name_input_dims(
    graph_module: torch.fx.GraphModule,
    io: GraphIO,
    namer: SymbolNamer,
    user_dim_names_by_position: list[dict[int, str]],
) -> None:
    """Give each symbolic input dim its user's name or `<input>_dim_<i>`: the user's names
    first, over all inputs, so that a symbol the user named gets that name wherever it
    appears first."""
    user_inputs = [n for n in placeholder_nodes(graph_module) if n.name not in io.lifted_tensors]
    tensors = [(position, node, node.meta.get("val")) for position, node in enumerate(user_inputs)
               if isinstance(node.meta.get("val"), torch.Tensor)]
    for position, _, meta in tensors:
        given = user_dim_names_by_position[position] if position < len(user_dim_names_by_position) else {}
        for index, name in given.items():
            if index < meta.dim():
                namer.name_user_dim(meta.shape[index], name)
    for _, node, meta in tensors:
        name = io.onnx_input_name(node.name)
        for index, size in enumerate(meta.shape):
            namer.name_symbol(size, dim_name(name, index))


def input_dim_expressions(graph_module: torch.fx.GraphModule, io: GraphIO, namer: SymbolNamer) -> list[tuple[Any, ...]]:
    """For each ONNX input, in order, each dim as an expression of the named symbols
    (`x_dim_0`, `past_dim_1 + new_dim_1`), None where it is static: the sizes the export
    tied together across inputs, for the call-time check (`program.tied_sizes`)."""
    onnx_inputs = {slot.name for slot in io.input_slots if slot.is_onnx_input}
    dims = []
    for node in placeholder_nodes(graph_module):
        if node.name not in onnx_inputs:
            continue
        meta = node.meta.get("val")
        shape = meta.shape if isinstance(meta, torch.Tensor) else ()
        dims.append(tuple(namer.named_expr(size) for size in shape))
    return dims
