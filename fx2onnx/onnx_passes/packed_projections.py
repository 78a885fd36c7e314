"""MatMulNBits layers that read the same input, packed into one (Q, K and V; gate and up).

One kernel over ``N = N1 + N2 + ...`` columns, then a ``Split``, costs less than a kernel
per projection, most of all when decoding one token. MatMulNBits quantizes each column
of W (row of B) on its own, so the packed codes, scales and zero points are the
projections' own, concatenated along N: the graph concatenates the initializers
(``Concat(axis=0)``), which onnxruntime folds into one constant when it loads the model.
The file keeps one tensor per weight, computed when written as before
(`derived_weights`): streaming and fake mode are unchanged.
"""

from __future__ import annotations

from collections import defaultdict

import onnx_ir as ir

from fx2onnx.onnx_passes.model_graphs import model_graphs
from fx2onnx.onnx_passes.weight_quantization import MS_DOMAIN

# inputs of MatMulNBits: A, B, scales, zero_points, g_idx, bias
_B, _SCALES, _ZERO_POINTS, _G_IDX, _BIAS = 1, 2, 3, 4, 5


def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if index < len(node.inputs) else None


def _signature(node: ir.Node) -> tuple:
    """What must agree for layers to be packed: attributes but N, which optional inputs."""
    attributes = tuple(sorted((k, a.value) for k, a in node.attributes.items() if k != "N"))
    present = tuple(_input(node, i) is not None for i in (_ZERO_POINTS, _G_IDX, _BIAS))
    return attributes, present


def _packable(node: ir.Node) -> bool:
    if node.op_type != "MatMulNBits" or node.domain != MS_DOMAIN or _input(node, _G_IDX) is not None:
        return False
    return all(v is None or v.is_initializer() for v in node.inputs[1:]) and "N" in node.attributes


def _concat(graph: ir.Graph, before: ir.Node, values: list[ir.Value], name: str) -> ir.Value:
    node = ir.node("Concat", values, {"axis": 0}, name=f"{name}/Concat")
    graph.insert_before(before, node)
    output = node.outputs[0]
    output.name = name
    output.dtype = values[0].dtype
    shapes = [v.shape for v in values]
    if all(s is not None for s in shapes):
        first = list(shapes[0])  # type: ignore[arg-type]
        output.shape = ir.Shape([sum(int(s[0]) for s in shapes), *first[1:]])  # type: ignore[index]
    return output


def _pack(graph: ir.Graph, nodes: list[ir.Node]) -> None:
    first = nodes[0]
    sizes = [n.attributes["N"].as_int() for n in nodes]
    stem = first.name or "packed"
    inputs: list[ir.Value | None] = [first.inputs[0]]
    for index in range(1, len(first.inputs)):
        values = [n.inputs[index] for n in nodes]
        inputs.append(None if values[0] is None else _concat(graph, first, values, f"{stem}/packed_{index}"))  # type: ignore[arg-type]
    attributes = {k: a.value for k, a in first.attributes.items()}
    attributes["N"] = sum(sizes)
    packed = ir.node("MatMulNBits", inputs, attributes, domain=MS_DOMAIN, name=f"{stem}/packed")
    graph.insert_before(first, packed)
    split_sizes = ir.Value(name=f"{stem}/packed_split", const_value=ir.tensor(sizes, dtype=ir.DataType.INT64))
    split_sizes.shape, split_sizes.dtype = ir.Shape([len(sizes)]), ir.DataType.INT64
    graph.register_initializer(split_sizes)
    split = ir.node("Split", [packed.outputs[0], split_sizes], {"axis": -1}, num_outputs=len(nodes), name=f"{stem}/Split")
    graph.insert_after(packed, split)
    packed.outputs[0].dtype = first.outputs[0].dtype
    for node, output in zip(nodes, split.outputs):
        old = node.outputs[0]
        output.shape, output.type = old.shape, old.type
        old.replace_all_uses_with(output, replace_graph_outputs=True)
        name, old.name = old.name, None
        output.name = name
        graph.remove(node, safe=True)


def attention_inputs(model: ir.Model) -> list[tuple[ir.Value, ir.Value, ir.Value]]:
    """The (query, key, value) each `GroupQueryAttention` of ``model`` reads apart, in
    any of its graphs (a guard's branches read the main graph's projections)."""
    found = []
    for graph in model_graphs(model):
        for node in graph:
            if node.op_type == "GroupQueryAttention" and len(node.inputs) >= 3 and all(node.inputs[:3]):
                found.append((node.inputs[0], node.inputs[1], node.inputs[2]))
    return found  # type: ignore[return-value]


def _attention_group(nodes: list[ir.Node], attention: list[tuple[ir.Value, ir.Value, ir.Value]]) -> list[ir.Node] | None:
    """The three of ``nodes`` whose outputs a kernel reads as its query, key and value, in
    that order (other layers on the same input, a parallel block's MLP, left out)."""
    by_output = {node.outputs[0]: node for node in nodes}
    for inputs in attention:
        if all(value in by_output for value in inputs):
            return [by_output[value] for value in inputs]
    return None


def pack_projections(model: ir.Model, attention_only: bool = False) -> int:
    """Pack the MatMulNBits of ``model``'s main graph that read the same input (with the
    same attributes but N, and the same optional inputs); the number of packed groups.
    With ``attention_only``, only the query, key and value of a `GroupQueryAttention`
    (which reads them packed, `packed_attention_inputs`, with no `Split` where it runs)."""
    groups: dict[tuple, list[ir.Node]] = defaultdict(list)
    for node in model.graph:
        if _packable(node):
            groups[(id(node.inputs[0]), _signature(node))].append(node)
    attention = attention_inputs(model)
    packed = 0
    for nodes in groups.values():
        query_key_value = _attention_group(nodes, attention)
        if attention_only:
            nodes = query_key_value or []
        elif query_key_value is not None and len(nodes) == 3:
            nodes = query_key_value  # in the kernel's order, for it to read them packed
        if len(nodes) > 1:
            _pack(model.graph, nodes)
            packed += 1
    return packed
