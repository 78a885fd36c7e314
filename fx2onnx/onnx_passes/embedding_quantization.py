"""The token embedding quantized block-wise: ``Gather(E, input_ids)`` ->
``com.microsoft.GatherBlockQuantized``.

A causal LM's embedding is the largest weight left float in an int4 folder (a quarter of
a 4 x 512 LLaMA with 32000 tokens). onnxruntime's ``GatherBlockQuantized`` gathers rows of
a block-quantized table and dequantizes only them: ``data`` is uint8 ``[V, K_padded *
bits / 8]`` (4-bit codes two to a byte, low nibble first, K padded to whole blocks),
``scales`` ``[V, k_blocks]`` in the activations' type, no zero points (the implicit
``2 ** (bits - 1)``, as symmetric MatMulNBits), ``gather_axis`` 0, ``quantize_axis`` 1,
``bits`` and ``block_size`` those of the linear layers (of the LM head when tied to it).
These are MatMulNBits' codes and scales of the same ``[V, K]`` matrix (`nbits_packing`),
laid out in two dims:

- an embedding tied to an LM head that is MatMulNBits (the same weight) gathers from the
  head's own codes and scales, reshaped (onnxruntime folds the Reshapes at load), so the
  two stay one quantization and the float table leaves the file;
- any other embedding gets codes and scales of its own, computed when the model is
  written (`derived_weights`), like MatMulNBits'.

K padded to whole blocks gives padded rows: a ``Slice`` takes the first K columns.
"""

from __future__ import annotations

import onnx_ir as ir
import torch

from fx2onnx.onnx_passes.derived_weights import DerivedTensor, fresh_name, register_derived
from fx2onnx.onnx_passes.linear_layers import FLOAT_WEIGHT_TYPES, take_place
from fx2onnx.onnx_passes.nbits_packing import block_count, pack_weight
from fx2onnx.onnx_passes.weight_quantization import MS_DOMAIN, WeightQuantization

_TORCH_TYPES = {ir.DataType.FLOAT: torch.float32, ir.DataType.FLOAT16: torch.float16}


def _token_embedding(node: ir.Node, indices_name: str) -> ir.Value | None:
    """The table of a ``Gather(table, <indices_name>)`` along axis 0 of a 2-D float weight."""
    if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or node.attributes.get_int("axis", 0) != 0:
        return None
    table, indices = node.inputs[0], node.inputs[1]
    if indices is None or indices.name != indices_name or not indices.is_graph_input():
        return None
    if table is None or not table.is_initializer() or table.dtype not in FLOAT_WEIGHT_TYPES:
        return None
    shape = table.shape
    return table if shape is not None and len(shape) == 2 and all(isinstance(d, int) for d in shape) else None


def _tied_head(graph: ir.Graph, table: ir.Value, config: WeightQuantization) -> ir.Node | None:
    """The MatMulNBits whose codes are computed from ``table`` read as ``[N, K]`` = ``[V, K]``
    (with its own block size: the LM head's)."""
    assert table.shape is not None
    for node in graph:
        if node.op_type != "MatMulNBits" or node.domain != MS_DOMAIN:
            continue
        codes = node.inputs[1].const_value if node.inputs[1] is not None else None
        attributes = node.attributes
        if (
            isinstance(codes, DerivedTensor) and codes.group.source is table
            and (attributes.get_int("N", 0), attributes.get_int("K", 0)) == tuple(table.shape)
            and attributes.get_int("bits", 0) == config.bits
            and (len(node.inputs) < 4 or node.inputs[3] is None)
        ):
            return node
    return None


def _reshaped(graph: ir.Graph, before: ir.Node, value: ir.Value, shape: tuple[int, int]) -> ir.Value:
    assert value.name is not None
    target = ir.Value(name=fresh_name(graph, f"{value.name}_shape"), shape=ir.Shape([2]), type=ir.TensorType(ir.DataType.INT64),
                      const_value=ir.tensor(list(shape), dtype=ir.DataType.INT64))
    graph.register_initializer(target)
    node = ir.node("Reshape", [value, target], name=f"{value.name}/as_table")
    graph.insert_before(before, node)
    return node.outputs[0]


def _own_tables(graph: ir.Graph, table: ir.Value, config: WeightQuantization, rows: tuple[int, int]) -> list[ir.Value]:
    assert table.name is not None and table.dtype is not None
    names = [fresh_name(graph, f"{table.name}_Q{config.bits}"), fresh_name(graph, f"{table.name}_scales")]
    scales_type = _TORCH_TYPES[table.dtype]
    vocabulary, blocks = rows[0], rows[1]

    def derive(stored: torch.Tensor) -> dict[str, torch.Tensor]:
        packed = pack_weight(stored, config.bits, config.block_size, symmetric=True, algorithm=config.algorithm)
        return {names[0]: packed.codes.reshape(vocabulary, -1), names[1]: packed.scales.reshape(vocabulary, blocks).to(scales_type)}

    width = blocks * config.block_size * config.bits // 8
    specs = [(names[0], ir.DataType.UINT8, (vocabulary, width)), (names[1], table.dtype, (vocabulary, blocks))]
    return register_derived(graph, table, derive, specs)


def quantize_embeddings(model: ir.Model, config: WeightQuantization, indices_name: str = "input_ids") -> list[str]:
    """Make the Gather of every token embedding of ``model``'s main graph (a 2-D float
    weight indexed by the graph input ``indices_name``) a ``GatherBlockQuantized`` (see
    the module docstring); the names of the embeddings quantized. Run it after
    `quantize_linear_weights`, whose LM head a tied embedding reads."""
    if not config.symmetric:
        raise ValueError("the embedding is quantized symmetrically (GatherBlockQuantized without zero points) only.")
    graph = model.graph
    quantized = []
    for node in list(graph):
        table = _token_embedding(node, indices_name)
        if table is None:
            continue
        assert table.shape is not None and table.name is not None
        vocabulary, k = (int(d) for d in table.shape)
        head = _tied_head(graph, table, config)
        block_size = head.attributes.get_int("block_size", 0) if head is not None else config.block_size
        blocks = block_count(k, block_size)
        if head is not None:
            width = blocks * block_size * config.bits // 8
            data = _reshaped(graph, node, head.inputs[1], (vocabulary, width))  # type: ignore[arg-type]
            scales = _reshaped(graph, node, head.inputs[2], (vocabulary, blocks))  # type: ignore[arg-type]
        else:
            data, scales = _own_tables(graph, table, config, (vocabulary, blocks))
        attributes = {"bits": config.bits, "block_size": block_size, "gather_axis": 0, "quantize_axis": 1}
        gather = ir.node("GatherBlockQuantized", [data, node.inputs[1], scales], attributes, domain=MS_DOMAIN, name=node.name)
        graph.insert_before(node, gather)
        output = gather.outputs[0]
        if blocks * block_size != k:  # padded columns off
            bounds = [ir.tensor([0], dtype=ir.DataType.INT64), ir.tensor([k], dtype=ir.DataType.INT64),
                      ir.tensor([-1], dtype=ir.DataType.INT64)]
            constants = [ir.node("Constant", [], {"value": t}) for t in bounds]
            sliced = ir.node("Slice", [output, *(c.outputs[0] for c in constants)], name=f"{node.name}/unpadded")
            graph.insert_before(node, [*constants, sliced])
            output = sliced.outputs[0]
        take_place(node.outputs[0], output)
        graph.remove(node, safe=True)
        if not table.uses():  # tied to a quantized head, or no longer read at all
            graph.initializers.pop(table.name)
        quantized.append(table.name)
    if quantized and MS_DOMAIN not in model.opset_imports:
        model.opset_imports[MS_DOMAIN] = 1
    return quantized
