"""Rewrites of a saved graph file in place, as the decoder steps for Transformers.js's
feeds make them (its inputs renamed, split or joined): the graph read without its weights,
rewritten, and written back atomically only when the rewrite changed it. Every rewrite of
a folder's graph file goes through `rewrite_graph_file`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from diagnostics import write_atomically


def rewrite_graph_file(path: Path, rewrite: Callable[[onnx.GraphProto], object]) -> bool:
    """Apply ``rewrite`` to the graph of the model file at ``path`` and save it when
    ``rewrite`` returns a true value; returns whether the file was written. Its external
    weights are left where they are (the graph keeps naming their file and offsets), and
    the file is replaced in one step: a failure leaves the old one."""
    model = onnx.load(str(path), load_external_data=False)
    if not rewrite(model.graph):
        return False
    write_atomically(path, model.SerializeToString())
    return True


def int64_constant(name: str, values: list[int], shape: tuple[int, ...] | None = None) -> onnx.NodeProto:
    """A `Constant` node named ``name`` giving the int64 tensor ``values`` (a list of them;
    ``shape`` () for a scalar)."""
    dims = [len(values)] if shape is None else list(shape)
    return helper.make_node("Constant", [], [name], name=name, value=helper.make_tensor(name, TensorProto.INT64, dims, values))


def rename_value(graph: onnx.GraphProto, old: str, new: str, nested: bool = False) -> None:
    """Rename value ``old`` to ``new`` in every node of ``graph`` and of its sub-graphs (an
    `If`'s branches read the outer graph's values by name), in its value infos, and in a
    sub-graph's inputs and outputs (the main graph's keep their public names)."""
    for node in graph.node:
        node.input[:] = [new if name == old else name for name in node.input]
        node.output[:] = [new if name == old else name for name in node.output]
        for attribute in node.attribute:
            for sub in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs):
                rename_value(sub, old, new, nested=True)
    for info in [*graph.value_info, *(list(graph.input) + list(graph.output) if nested else [])]:
        if info.name == old:
            info.name = new
