"""Weights without data (a model exported in fake mode) and the model around them.

Initializers that hold no data are swapped out while a graph pass or the serializer
reads the model: passes see graph inputs instead of reading them, and a model written
without weights gets each initializer as a graph input of its name, dtype and shape.
The model is never changed: the original tensors are put back after.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping

import onnx
import onnx_ir as ir

from fx2onnx.onnx_passes.serialization import serialize_model
from fx2onnx.translate.tensor_data import has_data


@contextlib.contextmanager
def swapped_initializers(model: ir.Model, tensors: Mapping[str, ir.TensorProtocol | None]) -> Iterator[None]:
    """Give initializers other tensors while serializing; put the originals back after
    (on those still in the graph: a pass run meanwhile may remove the unused ones, such
    as the weights of layers after the one whose output a model reads)."""
    originals = {name: model.graph.initializers[name].const_value for name in tensors}
    try:
        for name, tensor in tensors.items():
            model.graph.initializers[name].const_value = tensor
        yield
    finally:
        for name, tensor in originals.items():
            if name in model.graph.initializers:  # a pass in the block may drop a weight the graph never reads
                model.graph.initializers[name].const_value = tensor


# Metadata keys of initializers that are not weights of the model: computed at export from
# weights (batch norm or constant folding, `batch_norm_folding`, `weight_folding`), or a
# constant of the graph kept as an initializer (the portable target, `weight_folding`).
FOLDED_KEY = "pkg.fx2onnx.folded"
CONSTANT_KEY = "pkg.fx2onnx.constant"

def proto_with_weights_as_inputs(model: ir.Model) -> onnx.ModelProto:
    """The model without weight data: each weight becomes a graph input of its name,
    dtype and shape (after the user inputs). Constants of the graph kept as initializers
    (marked `CONSTANT_KEY`, the portable target) stay in the file."""
    placeholders = {
        name: ir.ExternalTensor("", 0, 0, value.dtype, shape=value.shape, name=name)  # type: ignore[arg-type]
        for name, value in model.graph.initializers.items() if not _is_graph_constant(value)
    }
    with swapped_initializers(model, placeholders):
        proto = serialize_model(model)
    graph = proto.graph
    weights = set(placeholders)
    kept_info = [info for info in graph.value_info if info.name not in weights]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    kept = [tensor for tensor in graph.initializer if tensor.name not in weights]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    for name in placeholders:
        graph.input.append(ir.serde.serialize_value(model.graph.initializers[name], name=name))
    return proto


def _is_graph_constant(value: ir.Value) -> bool:
    return CONSTANT_KEY in value.metadata_props


def fake_weights(model: ir.Model) -> list[str]:
    """Names of the initializers that hold no data (exported in fake mode)."""
    return [name for name, value in model.graph.initializers.items() if not has_data(value.const_value)]


class _DropNoConstantValueNotes(logging.Filter):
    """onnx_ir's passes note every initializer without a value: expected for fake weights."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "has no constant value" not in record.getMessage()


@contextlib.contextmanager
def fake_weights_hidden(model: ir.Model) -> Iterator[None]:
    """Initializers without data look like graph inputs for the time of the block (graph
    passes such as constant folding then leave them alone instead of reading them)."""
    hidden = fake_weights(model)
    if not hidden:
        yield
        return
    note_filter = _DropNoConstantValueNotes()
    loggers = [logging.getLogger("onnx_ir.passes.common.initializer_deduplication")]
    for logger in loggers:
        logger.addFilter(note_filter)
    try:
        with swapped_initializers(model, {name: None for name in hidden}):
            yield
    finally:
        for logger in loggers:
            logger.removeFilter(note_filter)
