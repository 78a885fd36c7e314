"""Constants in the one form every tool reads: a ``Constant`` node's ``value`` tensor.

ONNX also lets a Constant hold ``value_int(s)`` or ``value_float(s)``; onnxruntime's
symbolic shape inference, on which its transformers optimizer and quantizers rely, reads
only ``value`` and fails on the rest (and with it every fusion that compares shapes).
"""

from __future__ import annotations

import onnx_ir as ir

from fx2onnx.onnx_passes.model_graphs import model_nodes

# attribute -> the tensor dtype it stands for, and whether it is a scalar
_SHORT_FORMS = {
    "value_int": (ir.DataType.INT64, True),
    "value_ints": (ir.DataType.INT64, False),
    "value_float": (ir.DataType.FLOAT, True),
    "value_floats": (ir.DataType.FLOAT, False),
}


def _as_tensor_constant(node: ir.Node) -> None:
    for name, (dtype, scalar) in _SHORT_FORMS.items():
        attribute = node.attributes.get(name)
        if attribute is None:
            continue
        if attribute.is_ref():  # a function's attribute: its value is given at each call
            return
        data = attribute.value if scalar else list(attribute.value)
        del node.attributes[name]
        node.attributes["value"] = ir.AttrTensor("value", ir.tensor(data, dtype=dtype))
        return


def constants_as_tensors(model: ir.Model) -> int:
    """Rewrite every Constant of the model (graph, sub-graphs, functions) that holds a
    number or a list of numbers to hold it as a tensor; how many were rewritten."""
    rewritten = 0
    for node in model_nodes(model):
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and "value" not in node.attributes:
            _as_tensor_constant(node)
            rewritten += "value" in node.attributes
    return rewritten
