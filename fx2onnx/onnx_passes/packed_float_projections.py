"""A float layer's query, key and value projections as one MatMul, for the kernel to read packed.

Where a `GroupQueryAttention` reads its query, key and value from three MatMuls of the
same input, the layer runs three kernel calls where one over the joined columns computes
the same numbers (each output column is its own dot product), and the attention kernel is
fed three tensors where it could read one (`packed_attention_inputs`). Measured on a
4 x 512 LLaMA float folder in onnxruntime (a 1024-token prefill, one thread, the
profiler): the three MatMuls took 1.2% more than one, and the kernel fed them apart 5%
more than fed one packed tensor.

The joined weight (and bias) is one initializer of the file, computed from the three when
the model is written (`derived_weights`: fake mode and checkpoints read the three as
before), so that the tools that quantize a float file's MatMuls (onnxruntime's
`MatMulNBitsQuantizer`, `quantize_dynamic`) still find a weight behind every MatMul. A
quantized export packs its MatMulNBits after quantizing instead (`packed_projections`).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir
import torch

from fx2onnx.onnx_passes.derived_weights import fresh_name, register_derived
from fx2onnx.onnx_passes.packed_projections import attention_inputs

_STANDARD = ("", "ai.onnx")


@dataclass(frozen=True)
class _Projection:
    """A MatMul of a weight initializer, and the Add of a bias initializer after it (or None)."""

    matmul: ir.Node
    add: ir.Node | None
    bias: ir.Value | None

    @property
    def weight(self) -> ir.Value:
        return self.matmul.inputs[1]  # type: ignore[return-value]


def _sole_initializer(value: ir.Value | None, rank: int) -> bool:
    """An initializer of that rank that nothing else reads (a tied weight stays as it is)."""
    return (value is not None and value.is_initializer() and value.const_value is not None
            and value.shape is not None and len(value.shape) == rank and len(value.uses()) == 1)


def _projection(value: ir.Value) -> _Projection | None:
    """How ``value`` is computed, when it is ``x @ W`` or ``x @ W + b`` of initializers."""
    producer, add, bias = value.producer(), None, None
    if producer is not None and producer.op_type == "Add" and producer.domain in _STANDARD:
        add = producer
        first, second = producer.inputs
        product, bias = (first, second) if _sole_initializer(second, 1) else (second, first)
        if not _sole_initializer(bias, 1) or product is None or len(product.uses()) != 1:
            return None
        producer = product.producer()
    if producer is None or producer.op_type != "MatMul" or producer.domain not in _STANDARD:
        return None
    if not _sole_initializer(producer.inputs[1], 2):
        return None
    return _Projection(producer, add, bias)


def _packable(graph: ir.Graph, projections: list[_Projection | None]) -> bool:
    if any(p is None or p.matmul.graph is not graph for p in projections):
        return False
    first = projections[0]
    assert first is not None
    weights = [p.weight for p in projections]  # type: ignore[union-attr]
    return (all(p.matmul.inputs[0] is first.matmul.inputs[0] for p in projections)  # type: ignore[union-attr]
            and len({w.dtype for w in weights}) == 1 and len({int(w.shape[0]) for w in weights}) == 1
            and len({p.bias is None for p in projections}) == 1)  # type: ignore[union-attr]


def _joined(graph: ir.Graph, parts: list[ir.Value], axis: int, name: str) -> ir.Value:
    """One initializer of ``parts`` side by side along ``axis``, computed when written."""
    shape = [int(size) for size in parts[0].shape]  # type: ignore[union-attr]
    shape[axis] = sum(int(part.shape[axis]) for part in parts)  # type: ignore[index]
    name = fresh_name(graph, name)

    def derive(*tensors: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: torch.cat(tensors, dim=axis).contiguous()}

    (joined,) = register_derived(graph, parts, derive, [(name, parts[0].dtype, tuple(shape))])  # type: ignore[list-item]
    return joined


def _typed(value: ir.Value, like: ir.Value, name: str, columns: int | None = None) -> ir.Value:
    value.name, value.dtype = name, like.dtype
    if like.shape is not None and columns is not None:
        value.shape = ir.Shape([*list(like.shape)[:-1], columns])
    return value


def _pack(graph: ir.Graph, projections: list[_Projection], outputs: list[ir.Value]) -> None:
    matmuls = {p.matmul for p in projections}
    first = next(node for node in graph if node in matmuls)  # the earliest: the packed MatMul goes there
    weights = [p.weight for p in projections]
    stem = weights[0].name or "projections"
    columns = [int(w.shape[1]) for w in weights]  # type: ignore[index]
    matmul = ir.node("MatMul", [first.inputs[0], _joined(graph, weights, 1, f"{stem}_qkv_packed")],
                     name=f"{first.name}/qkv_packed")
    graph.insert_before(first, matmul)
    packed = _typed(matmul.outputs[0], outputs[0], f"{stem}_qkv_packed_output", sum(columns))
    last = matmul
    if projections[0].bias is not None:
        biases = [p.bias for p in projections]
        bias = _joined(graph, biases, 0, f"{biases[0].name or stem}_qkv_packed")  # type: ignore[arg-type,union-attr]
        add = ir.node("Add", [packed, bias], name=f"{first.name}/qkv_packed_bias")
        graph.insert_after(matmul, add)
        packed, last = _typed(add.outputs[0], outputs[0], f"{stem}_qkv_packed_biased", sum(columns)), add
    sizes = ir.Value(name=fresh_name(graph, f"{stem}_qkv_split"), const_value=ir.tensor(columns, dtype=ir.DataType.INT64))
    sizes.shape, sizes.dtype = ir.Shape([len(columns)]), ir.DataType.INT64
    graph.register_initializer(sizes)
    split = ir.node("Split", [packed, sizes], {"axis": -1}, num_outputs=len(outputs), name=f"{first.name}/qkv_split")
    graph.insert_after(last, split)
    for old, new in zip(outputs, split.outputs):
        new.shape, new.type = old.shape, old.type
        old.replace_all_uses_with(new, replace_graph_outputs=True)
        name, old.name = old.name, None
        new.name = name
    for projection in projections:
        read = (projection.weight, projection.bias)  # before the nodes let go of their inputs
        for node in (projection.add, projection.matmul):
            if node is not None:
                graph.remove(node, safe=True)
        for value in read:
            if value is not None and not value.uses() and value.name in graph.initializers:
                graph.initializers.pop(value.name)  # the packed initializer is computed from it when written


def pack_float_projections(model: ir.Model) -> int:
    """Each `GroupQueryAttention` whose query, key and value are three MatMuls (with or
    without bias additions) of one input in ``model``'s main graph reads them from one
    MatMul of the joined weights and a `Split`; returns how many layers were packed."""
    graph, packed = model.graph, 0
    for query_key_value in attention_inputs(model):
        outputs = list(query_key_value)
        projections = [_projection(value) for value in outputs]
        if _packable(graph, projections):
            _pack(graph, projections, outputs)  # type: ignore[arg-type]
            packed += 1
    return packed
