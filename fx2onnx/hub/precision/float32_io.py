"""Float32 inputs and outputs of a float16 one-pass folder, for the clients that feed and read them.

Transformers.js feeds `pixel_values`, `input_values` and `input_features` as its image and
audio processors make them, in float32, and casts nothing to the session's types: a
float16 folder whose `pixel_values` is float16 fails there ("Unexpected input data type.
Actual: (tensor(float)) , expected: (tensor(float16))"). Its pipelines post-process the
outputs as float32 too: in Node, which has no Float16Array, a float16 `logits` fails the
text-classification pipeline ("A float32 tensor's data must be type of Float32Array").
So a float16 one-pass folder takes and gives its float values in float32, cast to float16
by its first nodes and back by its last, the weights and everything between float16.
Integer inputs and outputs (token ids, masks) are untouched.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

_HALF, _FLOAT = ir.DataType.FLOAT16, ir.DataType.FLOAT


def _cast(value: ir.Value, to: ir.DataType, name: str) -> ir.Node:
    node = ir.Node("", "Cast", [value], [ir.AttrInt64("to", to)], num_outputs=1, name=f"{name}_cast")
    node.outputs[0].dtype, node.outputs[0].shape = to, value.shape
    return node


def float32_io(model: ir.Model, outputs: bool = True) -> list[str]:
    """Make every float16 input and output of ``model``'s graph float32 (in place): an
    input cast to float16 by a node before the rest of the graph, an output cast from
    float16 by a node after it; returns the names of the values changed. ``outputs=False``
    widens the inputs alone (an encoder whose output its own folder's decoder reads in
    float16)."""
    graph, changed = model.graph, []
    for index, value in enumerate(list(graph.inputs)):
        if value.dtype != _HALF:
            continue
        name = str(value.name)
        value.name = f"{name}_float16"
        widened = ir.Value(name=name, shape=value.shape, type=ir.TensorType(_FLOAT))
        cast = _cast(widened, _HALF, name)
        cast.outputs[0].name = value.name
        value.replace_all_uses_with(cast.outputs[0])
        graph.inputs[index] = widened
        if len(graph):
            graph.insert_before(graph.node(0), cast)
        else:
            graph.append(cast)
        changed.append(name)
    for index, value in enumerate(list(graph.outputs) if outputs else []):
        if value.dtype != _HALF:
            continue
        name = str(value.name)
        value.name = f"{name}_float16"
        cast = _cast(value, _FLOAT, name)
        cast.outputs[0].name = name
        graph.append(cast)
        graph.outputs[index] = cast.outputs[0]
        changed.append(name)
    return changed


_FLOAT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def in_declared_floats(session: Any, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``feed`` with each float array in the float type ``session`` declares for it (a
    verification's inputs are in transformers' model's dtype, float16, where such a folder
    takes float32); other arrays, and inputs of undeclared type, as they are."""
    floats = {i.name: _FLOAT_TYPES[i.type] for i in session.get_inputs() if getattr(i, "type", None) in _FLOAT_TYPES}
    return {k: v.astype(floats[k]) if k in floats and np.issubdtype(v.dtype, np.floating) else v for k, v in feed.items()}
