"""Weights stored in the layout their MatMul reads.

PyTorch keeps a linear layer's weight as ``[out, in]`` and computes ``x @ W.T``; translated
as it is, the graph reads ``MatMul(x, Transpose(W))``. The tools people run on exported
files (onnxruntime's ``quantize_dynamic``, ``quantize_static``, ``MatMulNBitsQuantizer``,
its transformers optimizer) look for a MatMul whose second input is an initializer, and a
Transpose in between hides every linear layer from them. So a 2-D weight that is only ever
read through ``Transpose(perm=[1, 0])`` is stored transposed and the Transposes go.

With module functions the weight reaches its Transpose as a function parameter, perhaps
through several nested calls. A parameter is changed only when every call of its function
gives it such a weight (or another such parameter), so that one function body serves all
its callers: the candidates are narrowed to a fixed point.

Nothing here reads weight data: a weight without data (fake mode) keeps none and is marked
(`STORED_TRANSPOSED`), and `stored_form` turns a tensor in PyTorch's layout into the
stored one wherever weights are written from a state dict or a checkpoint, one tensor at
a time. The mark is also written into the file, on the weight's value, for tools that
ship weights apart (``include_initializers=False``).
"""

from __future__ import annotations


import numpy as np
import onnx_ir as ir
import torch

from fx2onnx.onnx_passes.function_calls import FunctionCalls
from fx2onnx.onnx_passes.model_graphs import model_nodes
from fx2onnx.translate.tensor_data import TorchTensorData, has_data

# The metadata key and value on a weight stored as the transpose of PyTorch's tensor.
LAYOUT_KEY = "fx2onnx.stored_layout"
STORED_TRANSPOSED = "transposed"

_FunctionKey = tuple[str, str, str]


def is_stored_transposed(value: ir.Value) -> bool:
    """Whether ``value`` (an initializer) holds the transpose of the model's tensor."""
    return value.metadata_props.get(LAYOUT_KEY) == STORED_TRANSPOSED


def stored_form(value: ir.Value, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, given in the model's own layout, as the initializer ``value`` stores it
    (a view: the bytes are laid out when written)."""
    return tensor.t() if is_stored_transposed(value) else tensor


def _is_plain_transpose(node: ir.Node) -> bool:
    if node.domain not in ("", "ai.onnx") or node.op_type != "Transpose":
        return False
    perm = node.attributes.get("perm")
    return perm is None or list(perm.as_ints()) == [1, 0]


def _is_weight_dequantize(node: ir.Node, index: int) -> bool:
    """A DequantizeLinear of the weight per tensor or per channel (not block-wise): its
    transpose is the DequantizeLinear of the transposed integers along the other axis."""
    if node.domain not in ("", "ai.onnx") or node.op_type != "DequantizeLinear" or index != 0:
        return False
    block_size = node.attributes.get("block_size")
    return block_size is None or block_size.as_int() == 0


def _rank_two_or_unknown(value: ir.Value) -> bool:
    return value.shape is None or len(value.shape) == 2


class _Candidates:
    """Weights and function parameters that may be stored transposed, narrowed until
    every use of each is a plain Transpose or a call giving it to another candidate."""

    def __init__(self, model: ir.Model) -> None:
        self.functions: dict[_FunctionKey, ir.Function] = dict(model.functions)
        self.outputs = {id(v) for v in model.graph.outputs}
        for function in self.functions.values():
            self.outputs.update(id(v) for v in function.outputs)
        self.alive: dict[int, ir.Value] = {}
        for value in model.graph.initializers.values():
            if value.shape is not None and len(value.shape) == 2 and value.uses():
                self.alive[id(value)] = value
        for function in self.functions.values():
            for parameter in function.inputs:
                if _rank_two_or_unknown(parameter) and parameter.uses():
                    self.alive[id(parameter)] = parameter
        self.callers: dict[int, list[ir.Value | None]] = {}
        for node in model_nodes(model):
            called = self._called(node)
            if called is None:
                continue
            for index, parameter in enumerate(called.inputs):
                argument = node.inputs[index] if index < len(node.inputs) else None
                self.callers.setdefault(id(parameter), []).append(argument)

    def _called(self, node: ir.Node) -> ir.Function | None:
        return self.functions.get((node.domain, node.op_type, node.overload))

    def _only_transposed(self, value: ir.Value) -> bool:
        uses = value.uses()
        return id(value) not in self.outputs and bool(uses) and all(
            _is_plain_transpose(node) and id(node.outputs[0]) not in self.outputs for node, _ in uses
        )

    def _use_allowed(self, node: ir.Node, index: int) -> bool:
        if _is_plain_transpose(node):
            return id(node.outputs[0]) not in self.outputs
        if _is_weight_dequantize(node, index):
            return self._only_transposed(node.outputs[0])
        called = self._called(node)
        return called is not None and index < len(called.inputs) and id(called.inputs[index]) in self.alive

    def _keeps(self, value: ir.Value) -> bool:
        if id(value) in self.outputs:
            return False
        if not all(self._use_allowed(node, index) for node, index in value.uses()):
            return False
        arguments = self.callers.get(id(value))
        if arguments is None:  # an initializer, or a function never called
            return value.is_initializer()
        return all(argument is not None and id(argument) in self.alive for argument in arguments)

    def narrow(self) -> list[ir.Value]:
        changed = True
        while changed:
            changed = False
            for key, value in list(self.alive.items()):
                if not self._keeps(value):
                    del self.alive[key]
                    changed = True
        return list(self.alive.values())


def _transposed_tensor(tensor: ir.TensorProtocol) -> ir.TensorProtocol:
    if isinstance(tensor, TorchTensorData):
        # A view of the model's own tensor (or of a FakeTensor): no copy until written.
        return TorchTensorData(tensor.raw.t(), name=tensor.name)
    if not has_data(tensor):
        raise ValueError(f"weight {tensor.name!r} has no data and no torch tensor to take its layout from")
    return ir.tensor(np.ascontiguousarray(tensor.numpy().T), name=tensor.name)


def _drop_transposes(value: ir.Value) -> None:
    for node, index in list(value.uses()):
        if _is_weight_dequantize(node, index):
            _dequantize_along_the_other_axis(node)
            _drop_transposes(node.outputs[0])
            continue
        if not _is_plain_transpose(node):
            continue
        node.outputs[0].replace_all_uses_with(value)
        graph = node.graph
        assert graph is not None
        graph.remove(node, safe=True)


def _dequantize_along_the_other_axis(node: ir.Node) -> None:
    scale = node.inputs[1]
    per_tensor = scale is not None and scale.shape is not None and scale.shape.numpy() in ((), (1,))
    if not per_tensor:
        axis = node.attributes.get("axis")
        old_axis = 1 if axis is None else axis.as_int()  # DequantizeLinear's default axis is 1
        node.attributes["axis"] = ir.AttrInt64("axis", 1 - old_axis % 2)
    _reverse_shape(node.outputs[0])


def _reverse_shape(value: ir.Value) -> None:
    if value.shape is not None:
        value.shape = ir.Shape(list(reversed(list(value.shape))))


def store_weights_transposed(model: ir.Model) -> list[str]:
    """Store every 2-D weight that is only read transposed in its transposed layout and
    remove those Transposes, in the graph and in module functions; the names of the
    weights changed."""
    changed = _Candidates(model).narrow()
    names = []
    for value in changed:
        if value.is_initializer():
            assert value.const_value is not None
            value.const_value = _transposed_tensor(value.const_value)
            value.metadata_props[LAYOUT_KEY] = STORED_TRANSPOSED
            assert value.name is not None
            names.append(value.name)
        _reverse_shape(value)
    # Transposes are removed after every shape is final, so that no use is visited twice.
    for value in changed:
        _drop_transposes(value)
    return names


_QUANTIZE_OPS = ("QuantizeLinear", "DequantizeLinear")


def _is_zero_point_cast(node: ir.Node, calls: FunctionCalls) -> bool:
    """A Cast of a stored tensor whose every reader (through function calls) takes it as
    a zero point."""
    if node.domain not in ("", "ai.onnx") or node.op_type != "Cast":
        return False
    source, result = node.inputs[0], node.outputs[0]
    if source is None or not source.is_initializer() or not has_data(source.const_value):
        return False
    uses = calls.final_uses(result)
    return bool(uses) and all(user.op_type in _QUANTIZE_OPS and index == 2 for user, index in uses)


def store_zero_points_quantized(model: ir.Model) -> list[str]:
    """Zero points stored in their quantized type: a ``Cast`` of a stored integer tensor
    (PyTorch keeps per-channel zero points as int64) that feeds only quantize and
    dequantize nodes becomes a stored tensor of the Cast's type, as onnxruntime's fusions
    of quantized operators require (they read a zero point only from an initializer).
    A zero point given to a module function is found through its calls; the Cast, on
    weights, is in the main graph. The names of the zero points made."""
    graph = model.graph
    calls = FunctionCalls(model)
    made = []
    for node in [n for n in graph if _is_zero_point_cast(n, calls)]:
        source, result = node.inputs[0], node.outputs[0]
        assert source is not None and source.const_value is not None and result.dtype is not None
        array = source.const_value.numpy().astype(result.dtype.numpy())
        result.replace_all_uses_with(graph.initializers.get(result.name) or _new_initializer(graph, result, array))
        graph.remove(node, safe=True)
        if not source.uses() and source.name in graph.initializers and not source.is_graph_output():
            del graph.initializers[source.name]
        made.append(result.name)
    return made


def _new_initializer(graph: ir.Graph, like: ir.Value, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=like.name, type=like.type, shape=like.shape, const_value=ir.tensor(array, name=like.name))
    graph.register_initializer(value)
    return value
