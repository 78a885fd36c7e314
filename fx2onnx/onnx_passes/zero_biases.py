"""Biases of zeros left out: ``Add(MatMul(x, W), b)`` with every element of ``b`` zero
becomes the MatMul's product itself.

A model's linear layers keep their bias even where it is all zeros (a freshly initialized
model's, or a checkpoint trained without it but saved with one): each such addition is
a kernel call a step that changes no number (``x + 0`` is ``x``; ``-0.0`` becomes ``0.0``,
equal in every comparison). Only a bias whose data the export holds is read: a weight
without data (fake mode) is left as it is, whatever it will hold.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from fx2onnx.translate.tensor_data import has_data

_PRODUCTS = ("MatMul", "Gemm")


def _zero_bias(value: ir.Value | None, product: ir.Value) -> bool:
    """Whether ``value`` is a 1-D initializer of zeros as wide as ``product``'s last dim
    and of its type (adding it changes neither the shape nor the numbers)."""
    if value is None or not value.is_initializer() or value.const_value is None or not has_data(value.const_value):
        return False
    shape = value.shape
    if shape is None or len(shape) != 1 or value.dtype != product.dtype:
        return False
    product_shape = product.shape
    if product_shape is None or len(product_shape) == 0 or not isinstance(product_shape[-1], int):
        return False
    if shape[0] != product_shape[-1]:
        return False
    return not np.any(value.const_value.numpy())


def drop_zero_biases(model: ir.Model) -> int:
    """Each addition of a zero bias to a product in ``model``'s main graph removed; how many."""
    graph = model.graph
    dropped = 0
    for node in list(graph):
        if node.op_type != "Add" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
            continue
        for index in (0, 1):
            product, bias = node.inputs[index], node.inputs[1 - index]
            producer = None if product is None else product.producer()
            if producer is None or producer.op_type not in _PRODUCTS or producer.graph is not graph:
                continue
            if not _zero_bias(bias, product) or node.outputs[0].is_graph_output():  # type: ignore[arg-type]
                continue
            node.outputs[0].replace_all_uses_with(product)  # type: ignore[arg-type]
            graph.remove(node, safe=True)
            if not bias.uses() and bias.name in graph.initializers:  # type: ignore[union-attr]
                graph.initializers.pop(bias.name)  # type: ignore[union-attr,arg-type]
            dropped += 1
            break
    return dropped
