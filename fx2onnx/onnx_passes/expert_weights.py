"""The expert weights of onnxruntime's ``MoE`` written in the kernel's layout.

The fused-kernel rule gives the kernel transformers' expert weights through the
``Transpose`` (and, for gate and up halves side by side, ``Reshape``) nodes that put
them in its layout. onnxruntime folds those nodes when it loads the model, but its CPU
kernel prepacks only the weights the file holds as initializers: fed the folded ones, it
took 2.6 to 45 ms a decode step against 2.3 to 4.3 (a gpt-oss-shaped 4 x 512 decoder at a
2048-token context, a loaded machine). So each such chain from an initializer is computed when the model is
written (a derived initializer, ``derived_weights``), and the kernel reads its result.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir
import torch

from dispatcher.functions.fused import ONNXRUNTIME_DOMAIN
from fx2onnx.onnx_passes.derived_weights import fresh_name, register_derived

_WEIGHT_INPUTS = (2, 4)  # fc1_experts_weights, fc2_experts_weights
_STANDARD = ("", "ai.onnx")


def _constant_ints(value: ir.Value | None) -> list[int] | None:
    """The integers of a constant ``value`` (an initializer, a Constant's output, or a
    Concat of such, as a reshape's target shape is written)."""
    if value is None:
        return None
    tensor = value.const_value
    producer = value.producer()
    if tensor is None and producer is not None and producer.op_type == "Concat" and producer.domain in _STANDARD:
        parts = [_constant_ints(part) for part in producer.inputs]
        return None if any(part is None for part in parts) else [x for part in parts for x in part]  # type: ignore[union-attr]
    if tensor is None and producer is not None and producer.op_type == "Constant" and producer.domain in _STANDARD:
        attribute = producer.attributes.get("value")
        tensor = attribute.as_tensor() if attribute is not None else None
    return None if tensor is None else [int(x) for x in tensor.numpy().reshape(-1)]


def _step(node: ir.Node) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """What ``node`` (a Transpose, or a Reshape of constant shape) does to a weight, read
    now (the pass removes the node); None for another node."""
    if node.domain not in _STANDARD:
        return None
    if node.op_type == "Transpose":
        perm = node.attributes.get_ints("perm", None)
        return lambda weight: weight.permute(*(perm if perm is not None else reversed(range(weight.dim()))))
    if node.op_type == "Reshape":
        shape = _constant_ints(node.inputs[1])
        if shape is None:
            return None
        keeps_zeros = node.attributes.get_int("allowzero", 0)  # else a 0 copies the input's size

        def reshape(weight: torch.Tensor) -> torch.Tensor:
            return weight.reshape([size if size or keeps_zeros else weight.shape[i] for i, size in enumerate(shape)])

        return reshape
    return None


def _layout_chain(value: ir.Value) -> tuple[ir.Value, list[ir.Node]] | None:
    """``(initializer, nodes)`` when ``value`` is the initializer put in another layout by
    ``nodes`` (first to last), each read by the next alone."""
    chain: list[ir.Node] = []
    while (producer := value.producer()) is not None:
        if len(value.uses()) != 1 or producer.op_type not in ("Transpose", "Reshape") or producer.domain not in _STANDARD:
            return None
        chain.append(producer)
        value = producer.inputs[0]
    if not chain or not value.is_initializer() or value.const_value is None or value.shape is None:
        return None
    return value, chain[::-1]


def _applied(steps: list, weight: torch.Tensor) -> torch.Tensor:
    for step in steps:
        weight = step(weight)
    return weight


def _remove_unread(graph: ir.Graph, value: ir.Value | None) -> None:
    """``value``'s initializer or Constant node, when nothing reads it any more."""
    if value is None or value.uses():
        return
    producer = value.producer()
    if producer is not None and producer.op_type in ("Constant", "Concat"):
        parts = list(producer.inputs)
        graph.remove(producer, safe=True)
        for part in parts:
            _remove_unread(graph, part)
    elif value.is_initializer() and value.name is not None:
        graph.initializers.pop(value.name)


def write_expert_weights(model: ir.Model) -> int:
    """Make every ``MoE`` weight of ``model``'s main graph that a chain of ``Transpose`` and
    ``Reshape`` computes from an initializer an initializer of its own, computed when the
    model is written; returns how many."""
    graph, written = model.graph, 0
    for node in [n for n in graph if n.op_type == "MoE" and n.domain == ONNXRUNTIME_DOMAIN]:
        for index in _WEIGHT_INPUTS:
            found = _layout_chain(node.inputs[index]) if node.inputs[index] is not None else None
            if found is None:
                continue
            source, chain = found
            steps = [_step(node) for node in chain]
            if any(step is None for step in steps):  # a shape known at run time only: onnxruntime folds the chain
                continue
            layout = _applied(steps, torch.empty(tuple(int(size) for size in source.shape), device="meta"))
            assert source.name is not None and source.dtype is not None
            name = fresh_name(graph, f"{source.name}_moe_layout")

            def derive(stored: torch.Tensor, steps: list = steps, name: str = name) -> dict[str, torch.Tensor]:
                return {name: _applied(steps, stored).contiguous()}

            (weight,) = register_derived(graph, source, derive, [(name, source.dtype, tuple(layout.shape))])
            node.replace_input_with(index, weight)
            for step in reversed(chain):
                shape = step.inputs[1] if step.op_type == "Reshape" else None
                graph.remove(step, safe=True)
                _remove_unread(graph, shape)
            _remove_unread(graph, source)
            written += 1
    return written
