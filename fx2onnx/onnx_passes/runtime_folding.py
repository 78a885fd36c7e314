"""Nodes computable from constants that onnxscript's folder leaves, computed by onnxruntime.

onnxscript's folder evaluates nodes with ONNX's reference evaluator, which fails on some
inputs it should take (its `GatherElements` with indices smaller than the data along the
other axes: BERT's ``token_type_ids[:, :seq]`` at static shapes) and then leaves the node
in the graph. Such a node, of the standard domain, deterministic, without sub-graphs, whose
inputs are all constants, is run here once in onnxruntime on its own and replaced by its
results (the nodes the folder keeps on purpose, `ConstantOfShape` and quantization, stay); a node onnxruntime refuses stays, with the reason logged. The results keep the
folder's limit on the size of a folded output, and inputs larger than `INPUT_SIZE_LIMIT`
are not copied into a session.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import numpy as np
import onnx
import onnx_ir as ir

from fx2onnx.onnx_passes.model_graphs import has_subgraph

# the folder's own limit on a folded output (onnxscript's DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT)
OUTPUT_SIZE_LIMIT = 512 * 512
# elements of all inputs of one node copied into a session (64 MiB of float32)
INPUT_SIZE_LIMIT = 16 * 1024 * 1024
_NON_DETERMINISTIC = frozenset({"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Multinomial",
                                "Bernoulli"})
# what the folder keeps on purpose: a filled tensor is smaller as its shape, and the
# quantization nodes carry what runtimes fuse
_KEPT_BY_THE_FOLDER = frozenset({"ConstantOfShape", "DequantizeLinear", "DynamicQuantizeLinear", "QuantizeLinear"})

_logger = logging.getLogger(__name__)


def _constant_inputs(node: ir.Node) -> list[ir.TensorProtocol | None] | None:
    """The node's input tensors (None for an omitted optional input), or None when one
    input is not a constant."""
    tensors: list[ir.TensorProtocol | None] = []
    for value in node.inputs:
        # an initializer that is also a graph input is a default the caller may replace
        tensor = None if value is None or value.is_graph_input() else ir.convenience.get_const_tensor(value)
        if value is not None and tensor is None:
            return None
        tensors.append(tensor)
    return tensors


def _may_run(node: ir.Node) -> bool:
    return (node.domain in ("", "ai.onnx") and node.op_type not in ("Constant", *_NON_DETERMINISTIC, *_KEPT_BY_THE_FOLDER)
            and bool(node.inputs)
            and not has_subgraph(node))


def _run_alone(node: ir.Node, tensors: list[ir.TensorProtocol | None], opset: int) -> list[np.ndarray] | None:
    """The node's outputs computed by onnxruntime on CPU, or None (logged) where it refuses."""
    proto = ir.serde.serialize_node(node)
    proto.ClearField("name")
    del proto.input[:], proto.output[:]
    proto.input.extend("" if tensor is None else f"in{i}" for i, tensor in enumerate(tensors))
    proto.output.extend(f"out{i}" for i in range(len(node.outputs)))
    initializers = []
    for i, tensor in enumerate(tensors):
        if tensor is not None:
            serialized = ir.serde.serialize_tensor(tensor)
            serialized.name = f"in{i}"
            initializers.append(serialized)
    outputs = [onnx.helper.make_empty_tensor_value_info(name) for name in proto.output]
    graph = onnx.helper.make_graph([proto], "fold", [], outputs, initializer=initializers)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    results = run_in_onnxruntime(model, [{}], f"fold {node.name} ({node.op_type})", optimize=False)
    return None if results is None else results[0]


def run_in_onnxruntime(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]], what: str,
                       optimize: bool = True) -> list[list[np.ndarray]] | None:
    """``model``'s outputs for each of ``feeds``, computed by onnxruntime on CPU at export
    time; None where onnxruntime refuses the model (logged with ``what`` it was for)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # a refusal is logged below, not printed by the runtime
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return [session.run(None, feed) for feed in feeds]
    except Exception as error:  # noqa: BLE001 - any refusal of onnxruntime: the caller keeps the graph as it is
        _logger.debug("onnxruntime does not %s: %s", what, error)
        return None


def fold_with_onnxruntime(
    container: ir.Graph | ir.Function, opset: int, may_fold: Callable[[ir.Node], bool] = lambda node: True,
    *, as_initializers: bool = False,
) -> list[ir.Value]:
    """Replace each node of ``container`` (in order, so that chains fold through) whose
    inputs are all constants and that ``may_fold`` accepts by its results computed in
    onnxruntime: Constant nodes, or initializers of the graph (``as_initializers``);
    returns the values made."""
    try:
        import onnxruntime  # noqa: F401 - only checks that the runtime is installed
    except ImportError:  # no runtime installed: the folder's results are all there is
        return []
    made: list[ir.Value] = []
    for node in list(container):
        if not _may_run(node) or not may_fold(node):
            continue
        tensors = _constant_inputs(node)
        if tensors is None or sum(math.prod(t.shape.numpy()) for t in tensors if t is not None) > INPUT_SIZE_LIMIT:
            continue
        results = _run_alone(node, tensors, opset)
        if results is None or any(np.asarray(result).size > OUTPUT_SIZE_LIMIT for result in results):
            continue
        for output, result in zip(node.outputs, results):
            name, output.name = output.name, None
            value = _constant(container, node, ir.tensor(np.asarray(result), name=name), as_initializers)
            value.type = output.type or ir.TensorType(value.const_value.dtype)
            output.replace_all_uses_with(value, replace_graph_outputs=True)
            made.append(value)
        container.remove(node, safe=True)
    return made


def _constant(container: ir.Graph | ir.Function, before: ir.Node, tensor: ir.Tensor, as_initializer: bool) -> ir.Value:
    """``tensor`` as an initializer of ``container`` or a Constant node before ``before``."""
    if as_initializer:
        assert isinstance(container, ir.Graph), "only a graph has initializers"
        value = ir.Value(name=tensor.name, shape=ir.Shape(tensor.shape), const_value=tensor)
        container.register_initializer(value)
        return value
    constant = ir.node("Constant", [], attributes={"value": tensor})
    value = constant.outputs[0]
    value.name, value.shape, value.const_value = tensor.name, ir.Shape(tensor.shape), tensor
    container.insert_before(before, constant)
    return value
