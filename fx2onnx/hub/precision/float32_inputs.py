"""Float32 inputs of a float16 one-pass folder, for the clients that feed their processors' tensors.

Transformers.js feeds `pixel_values`, `input_values` and `input_features` as its image and
audio processors make them, in float32, and casts nothing to the session's types: a
float16 folder whose `pixel_values` is float16 fails there ("Unexpected input data type.
Actual: (tensor(float)) , expected: (tensor(float16))"). Such a folder takes its float
inputs in float32 and casts them to float16 as its first nodes, as the float16 models
Transformers.js's own hub folders hold do. Integer inputs (token ids, masks) are untouched.
"""

from __future__ import annotations

import onnx_ir as ir

_HALF, _FLOAT = ir.DataType.FLOAT16, ir.DataType.FLOAT


def float32_inputs(model: ir.Model) -> list[str]:
    """Make every float16 input of ``model``'s graph float32, cast to float16 by a node
    before the rest of the graph (in place); returns the names of the inputs changed."""
    graph, changed = model.graph, []
    for index, value in enumerate(list(graph.inputs)):
        if value.dtype != _HALF:
            continue
        name = str(value.name)
        value.name = f"{name}_float16"
        widened = ir.Value(name=name, shape=value.shape, type=ir.TensorType(_FLOAT))
        cast = ir.Node("", "Cast", [widened], [ir.AttrInt64("to", _HALF)], num_outputs=1, name=f"{name}_to_float16")
        cast.outputs[0].name, cast.outputs[0].dtype, cast.outputs[0].shape = value.name, _HALF, value.shape
        value.replace_all_uses_with(cast.outputs[0])
        graph.inputs[index] = widened
        if len(graph):
            graph.insert_before(graph.node(0), cast)
        else:
            graph.append(cast)
        changed.append(name)
    return changed
