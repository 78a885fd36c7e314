"""Write an ONNX model to disk with its weights taken from where they are.

- Weights come from the program's initializers, or by name from a `WeightSource`
  (a state dict or checkpoint) for the ones it holds.
- External data is streamed tensor by tensor into one data file: at most one tensor's
  bytes are in Python's hands at a time (a memory-mapped checkpoint or a contiguous
  torch tensor is not even copied). The proto keeps only references.
- Without external data the weights are embedded (the protobuf limit is 2 GB).
- Without initializers the weights become graph inputs named after them, as the former
  `torch.onnx.dynamo_export` wrote them, so that weights can be shipped apart.
- Files go through `diagnostics.files.staged_files`: a failure at any point leaves the
  destination as it was. Saving without external data removes the data file this
  program's earlier save left beside the model (recognised by its name and by the model
  it replaces referencing it), never another file.

The model is not changed: initializer tensors are swapped for the time of serializing.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from typing import BinaryIO
from pathlib import Path

import onnx
import onnx_ir as ir
import torch

from diagnostics.files import StagedFiles, resolve_destination, staged_files
from dispatcher import torch_dtype_to_onnx
from fx2onnx.onnx_passes.model_graphs import model_nodes
from fx2onnx.onnx_passes.serialization import serialize_model
from fx2onnx.onnx_passes.fake_weights import proto_with_weights_as_inputs, swapped_initializers
from fx2onnx.translate.tensor_data import TorchTensorData, real_view, tensor_bytes_view

# name of an initializer -> a function giving its tensor (called once, when written)
WeightGetter = Callable[[], "torch.Tensor | ir.TensorProtocol"]

PRODUCER_NAME = "fx2onnx"


def data_file_name(destination: str | os.PathLike) -> str:
    """The external data file of a model: `<model file name>.data`, beside it."""
    return Path(destination).name + ".data"


def initializer_bytes(model: ir.Model) -> int:
    """Bytes of all initializers, from dtypes and shapes (no data is read)."""
    return sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)


# ONNX dtype -> torch dtype a checkpoint's floating-point tensor is converted to
_CAST_TARGETS = {
    torch_dtype_to_onnx(dtype): dtype
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
}


def _checked(name: str, value: ir.Value, tensor: torch.Tensor | ir.TensorProtocol) -> torch.Tensor | ir.TensorProtocol:
    """The tensor for initializer ``name``, cast to its declared dtype; a shape that does
    not fit is an error naming both."""
    expected = tuple(value.shape.numpy()) if value.shape is not None else None
    if isinstance(tensor, TorchTensorData) and tensor.has_data:
        tensor = tensor.raw  # write from the torch storage, never through a bytes copy
    if isinstance(tensor, torch.Tensor):
        tensor = real_view(tensor.detach())
        if expected is not None and tuple(tensor.shape) != expected:
            raise ValueError(
                f"model_state['{name}'] has shape {tuple(tensor.shape)}; the exported model declares "
                f"{expected}. Give the weights of the model that was exported."
            )
        if value.dtype is not None and torch_dtype_to_onnx(tensor.dtype) != value.dtype:
            tensor = _converted(name, tensor, value.dtype)
    return tensor


def _converted(name: str, tensor: torch.Tensor, dtype: ir.DataType) -> torch.Tensor:
    """The one dtype rule for model_state: a floating-point tensor stored in another
    floating-point precision (a bfloat16 checkpoint for a float32 export) is converted,
    with a warning; any other difference is an error."""
    target = _CAST_TARGETS.get(dtype)
    if target is None or not (tensor.is_floating_point() and target.is_floating_point):
        raise TypeError(
            f"model_state['{name}'] is {tensor.dtype}; the exported model declares ONNX {dtype}. Only "
            "floating-point precisions are converted: give this tensor as the model has it, or export "
            "the model in the checkpoint's dtypes."
        )
    warnings.warn(
        f"model_state holds {tensor.dtype} tensors where the exported model has {target}: they are "
        f"converted to {target} as they are written. To keep the checkpoint's precision, export the "
        f"model in it (model.to({tensor.dtype}) before dynamo_export).",
        stacklevel=2,
    )
    return tensor.to(target)


def _write_tensor(stream, tensor: torch.Tensor | ir.TensorProtocol) -> int:  # noqa: ANN001 - binary file
    """Write one tensor's bytes; return how many."""
    if isinstance(tensor, torch.Tensor):
        view = tensor_bytes_view(tensor)
        stream.write(memoryview(view))
        return view.nbytes
    data = tensor.tobytes()
    stream.write(data)
    return len(data)


# Small integer initializers stay in the model file (below onnx's own size threshold):
# they may be shape inputs (a Slice's starts, a Reshape's shape), whose values onnxruntime
# reads only from there.
EMBEDDED_BELOW_BYTES = 1024


def _stays_embedded(tensor: torch.Tensor | ir.TensorProtocol) -> bool:
    if isinstance(tensor, torch.Tensor):
        integral = not (tensor.is_floating_point() or tensor.is_complex())
        return integral and tensor.numel() * tensor.element_size() < EMBEDDED_BELOW_BYTES
    return tensor.dtype.is_integer() and tensor.nbytes < EMBEDDED_BELOW_BYTES


def _float_shape_inputs(model: ir.Model) -> set[str]:
    """The initializers a Resize reads as its roi or scales: float values onnxruntime's shape
    inference reads from the model file only (a folder of opset 20 failed to load, "Cannot
    parse data from external tensors", with them in the data file)."""
    return {str(value.name) for node in model_nodes(model) if node.op_type == "Resize" and node.domain in ("", "ai.onnx")
            for value in node.inputs[1:3] if value is not None and value.is_initializer()}


def _external_tensors(
    model: ir.Model, getters: Mapping[str, WeightGetter], data_path: Path, data_name: str
) -> dict[str, ir.TensorProtocol]:
    """Stream every initializer into ``data_path`` but small integer ones and a Resize's
    roi and scales; the tensors to put in the proto (references to the file, the others themselves)."""
    references: dict[str, ir.TensorProtocol] = {}
    offset = 0
    embedded = _float_shape_inputs(model)
    with open(data_path, "wb") as stream:
        for name, value in model.graph.initializers.items():
            tensor = _checked(name, value, getters[name]())
            if _stays_embedded(tensor) or name in embedded:
                references[name] = TorchTensorData(tensor, name=name) if isinstance(tensor, torch.Tensor) else tensor
                continue
            length = _write_tensor(stream, tensor)
            assert value.dtype is not None and value.shape is not None
            references[name] = ir.ExternalTensor(
                data_name, offset, length, value.dtype, shape=value.shape, name=name, base_dir=data_path.parent
            )
            offset += length
            del tensor  # one tensor at a time
        stream.flush()
        os.fsync(stream.fileno())
    return references


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        byte, number = number & 0x7F, number >> 7
        out.append(byte | (0x80 if number else 0))
        if not number:
            return bytes(out)


def _field(number: int, payload_length: int) -> bytes:
    """The key and length of a length-delimited protobuf field (its payload follows)."""
    return _varint(number << 3 | 2) + _varint(payload_length)


# Field numbers of onnx.proto3: ModelProto.graph, GraphProto.initializer, TensorProto.raw_data
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9


def write_embedded(model: ir.Model, getters: Mapping[str, WeightGetter], stream: BinaryIO) -> None:
    """Write the model with its weights inside the protobuf to a binary stream, one tensor
    at a time.

    Protobuf lets a message's fields come in any order, so the file is written as the
    model's other fields, then the graph field: the graph without initializers followed
    by each initializer (its header, then its raw bytes straight from the tensor). Every
    length is known beforehand from dtypes and shapes.
    """
    proto = proto_with_weights_as_inputs(model)
    graph = proto.graph
    weights = {name for name in model.graph.initializers}
    kept_inputs = [i for i in graph.input if i.name not in weights]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    del graph.initializer[:]  # constants it kept too: every initializer is written below
    graph_head = graph.SerializeToString(deterministic=True)
    proto.ClearField("graph")
    model_head = proto.SerializeToString(deterministic=True)
    entries = []
    for name, value in model.graph.initializers.items():
        assert value.dtype is not None and value.shape is not None
        header = onnx.TensorProto(name=name, data_type=value.dtype.value, dims=list(value.shape.numpy()))
        header_bytes = header.SerializeToString(deterministic=True)
        nbytes = value.const_value.nbytes if value.const_value is not None else 0
        tensor_length = len(header_bytes) + len(_field(_TENSOR_RAW_DATA, nbytes)) + nbytes
        entries.append((name, value, header_bytes, nbytes, tensor_length))
    graph_length = len(graph_head) + sum(len(_field(_GRAPH_INITIALIZER, e[4])) + e[4] for e in entries)
    if len(model_head) + graph_length >= 2**31:
        raise ValueError(
            "The weights are too large for one protobuf (2 GB): save with external_data=True "
            "(or leave external_data unset to decide by size)."
        )
    stream.write(model_head)
    stream.write(_field(_MODEL_GRAPH, graph_length))
    stream.write(graph_head)
    for name, value, header_bytes, nbytes, tensor_length in entries:
        stream.write(_field(_GRAPH_INITIALIZER, tensor_length))
        stream.write(header_bytes)
        stream.write(_field(_TENSOR_RAW_DATA, nbytes))
        tensor = _checked(name, value, getters[name]())
        written = _write_tensor(stream, tensor)
        del tensor  # one tensor at a time
        if written != nbytes:
            raise ValueError(f"The weight '{name}' gave {written} bytes, its dtype and shape need {nbytes}.")


def _write_embedded_file(model: ir.Model, getters: Mapping[str, WeightGetter], path: Path) -> None:
    with open(path, "wb") as stream:
        write_embedded(model, getters, stream)
        stream.flush()
        os.fsync(stream.fileno())


def _stale_data_file(model_path: Path) -> Path | None:
    """The data file that the model at ``model_path`` (written by fx2onnx) references under
    this module's naming rule, if it exists: it is stale once that model is replaced by
    one with embedded weights."""
    data_path = model_path.with_name(data_file_name(model_path))
    if not (model_path.is_file() and data_path.is_file()):
        return None
    try:
        old = onnx.load_model(os.fspath(model_path), load_external_data=False)
    except Exception:  # noqa: BLE001 - not a model we can read: not ours, leave its files alone
        return None
    if old.producer_name != PRODUCER_NAME:
        return None
    for tensor in old.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = {entry.key: entry.value for entry in tensor.external_data}.get("location")
            if location == data_path.name:
                return data_path
    return None


def write_model(
    model: ir.Model,
    destination: str | os.PathLike,
    getters: Mapping[str, WeightGetter] | None,
    *,
    external_data: bool,
    data_name: str | None = None,
) -> None:
    """Write ``model`` to ``destination``.

    Args:
        getters: for each initializer, where its tensor comes from; None writes the
            weights as graph inputs without data.
        external_data: weights in `<destination name>.data` beside the model.
        data_name: another name for that file (the graph's external-data locations
            name it, as runtimes that fetch files by name need).
    """
    with staged_files() as files:
        model_temp = files.stage(destination)
        final = resolve_destination(destination)
        if getters is not None and external_data:
            data_name = data_name or data_file_name(final)
            data_temp = files.stage(final.with_name(data_name))
            references = _external_tensors(model, getters, data_temp, data_name)
            with swapped_initializers(model, references):
                _write_proto(serialize_model(model), model_temp)
            return
        # No data file this time: the one an earlier save wrote for this model is stale.
        _remove_stale_data(files, final)
        if getters is None:
            _write_proto(proto_with_weights_as_inputs(model), model_temp)
        else:
            _write_embedded_file(model, getters, model_temp)


def _remove_stale_data(files: StagedFiles, final: Path) -> None:
    stale = _stale_data_file(final)
    if stale is not None:
        files.remove_after_commit(stale)


def _write_proto(proto: onnx.ModelProto, path: Path) -> None:
    with open(path, "wb") as stream:
        stream.write(proto.SerializeToString(deterministic=True))
        stream.flush()
        os.fsync(stream.fileno())


def program_getters(model: ir.Model) -> dict[str, WeightGetter]:
    """Each initializer's own tensor (the weights the program holds)."""
    return {name: (lambda v=value: v.const_value) for name, value in model.graph.initializers.items()}
