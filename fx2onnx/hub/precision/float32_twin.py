"""The float32 twin of a float16 folder's ONNX files, for clients that cannot compute in float16.

Transformers.js 4 loads `onnx/model_fp16.onnx` where the folder's config says dtype "fp16";
on WebGPU it refuses that dtype where the adapter lacks `shader-f16` ("The device (webgpu)
does not support fp16") and does not fall back by itself. With ``float32_twin`` each
`<file>_fp16.onnx` of the folder gets a twin without the suffix (`onnx/model.onnx`, the file
of Transformers.js's dtype "fp32", weights in `model.onnx_data`): the same graph with every
float16 tensor, initializer, constant and cast target in float32. The float16 weights
widen exactly, so the twin computes the float16 model in float32 (transformers' float16
model after ``.float()``), and no second export is needed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import torch

from fx2onnx.hub.shared import folder_layout
from fx2onnx.onnx_passes import model_graphs

_HALF, _FLOAT = ir.DataType.FLOAT16, ir.DataType.FLOAT
_FP16_SUFFIX = "_fp16.onnx"
# integer attributes that name an element type (Cast's target, the dtype of EyeLike and the random ops)
_TYPE_ATTRIBUTES = ("to", "dtype")


def refusal(weights: torch.dtype, quantized: bool) -> str | None:
    """Why a folder of ``weights`` (``quantized`` or not) cannot have float32 twins, or None."""
    if weights != torch.float16 or quantized:
        return (f"float32_twin writes the float32 twin of a float16 folder's files; these weights are "
                f"{'quantized' if quantized else weights}: export with --precision fp16 (or --dtype float16), "
                f"or drop --float32-twin (a float32 folder is already the file Transformers.js falls back to).")
    return None


def _widened(tensor: ir.TensorProtocol) -> ir.Tensor:
    return ir.tensor(np.asarray(tensor.numpy(), dtype=np.float32), name=tensor.name)


def _widen_node(node: ir.Node) -> None:
    for name, attribute in list(node.attributes.items()):
        if attribute.type == ir.AttributeType.INT and name in _TYPE_ATTRIBUTES and attribute.value == _HALF:
            node.attributes[name] = ir.AttrInt64(name, _FLOAT)
        elif attribute.type == ir.AttributeType.TENSOR and attribute.value.dtype == _HALF:
            node.attributes[name] = ir.AttrTensor(name, _widened(attribute.value))
    for value in node.outputs:
        if value.dtype == _HALF:
            value.dtype = _FLOAT


def widen_to_float32(model: ir.Model) -> None:
    """``model`` with every float16 value, initializer, constant and cast target in float32, in place."""
    for graph in model_graphs(model):
        for value in [*graph.inputs, *graph.outputs, *(graph.initializers.values() if isinstance(graph, ir.Graph) else ())]:
            if value.dtype == _HALF:
                if value.const_value is not None:
                    value.const_value = _widened(value.const_value)
                value.dtype = _FLOAT
        for node in graph:
            _widen_node(node)


def float16_file(twin: str) -> str:
    """The float16 file whose twin is ``twin`` (`onnx/model.onnx` -> `onnx/model_fp16.onnx`)."""
    return twin[: -len(".onnx")] + _FP16_SUFFIX


def write_float32_twins(staging: Path, files: list[str]) -> list[str]:
    """The float32 twin of each `*_fp16.onnx` among the folder's ``files``; returns the
    paths written (each file and its data), relative to the folder."""
    written: list[str] = []
    for relative in files:
        if not relative.endswith(_FP16_SUFFIX):
            continue
        twin = relative[: -len(_FP16_SUFFIX)] + ".onnx"
        model = ir.load(staging / relative)
        widen_to_float32(model)
        ir.save(model, staging / twin, external_data=folder_layout.data_file(twin))
        written += folder_layout.with_data_file(twin)
    return written
