"""Weight-only quantization of linear layers: ``MatMul(x, W)`` -> ``com.microsoft.MatMulNBits``.

The runtime's own CPU form of an int4 or int8 LLM (what ONNX Runtime GenAI's model
builder writes for ``-p int4 -e cpu``): each linear layer keeps float activations and
reads its weight as block-wise integer codes with a scale per block (`nbits_packing`).
At accuracy level 4 onnxruntime's CPU kernel quantizes the activations to int8 on the
fly and multiplies in integers, which is where the speed comes from.

A linear layer is a MatMul whose second input is a 2-D float initializer, read as it is
(stored in MatMul's layout, see `weight_layout`) or through ``Transpose(perm=[1, 0])``
(a weight shared with an embedding, which keeps PyTorch's layout), or a Gemm of such a
weight (GPT-2's Conv1D); a ``[N]`` bias added to its product (the Add after a MatMul,
Gemm's C) becomes MatMulNBits' bias input. Its codes and scales
are `DerivedTensor`s: computed from the weight when the model is written, one weight at
a time, from the program's weight or the checkpoint's (fake mode). The float weight goes
when nothing else reads it; an embedding's Gather keeps reading a shared one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir
import torch

from fx2onnx.onnx_passes.derived_weights import DerivedGroup, DerivedTensor
from fx2onnx.onnx_passes.nbits_packing import pack_weight, packed_shapes

MS_DOMAIN = "com.microsoft"
# onnxruntime's CPU MatMulNBits computes in these activation types
_ACTIVATION_TYPES = {ir.DataType.FLOAT: torch.float32, ir.DataType.FLOAT16: torch.float16}


@dataclass(frozen=True)
class WeightQuantization:
    """How linear layers' weights are quantized.

    Args:
        bits: 4 or 8.
        block_size: rows of W (along K) sharing a scale; a power of two, at least 16.
            32, as the model builder's CPU default, keeps int4 close to float.
        accuracy_level: MatMulNBits' minimum accuracy of the activations: 4 (int8
            activations, the fast CPU path), 0 or 1 (float activations).
        symmetric: no zero points (the implicit 2 ** (bits - 1)); False stores one per block.
        lm_head: quantize the language-model head too (the builder's default for int4).
    """

    bits: int = 4
    block_size: int = 32
    accuracy_level: int = 4
    symmetric: bool = True
    lm_head: bool = True

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"weight quantization has 4 or 8 bits, not {self.bits}.")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ValueError(f"the block size must be a power of two of at least 16 (MatMulNBits); got {self.block_size}.")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise ValueError(f"the accuracy level is 0 to 4 (MatMulNBits); got {self.accuracy_level}.")


@dataclass
class QuantizedLinears:
    """What `quantize_linear_weights` changed."""

    quantized: list[str] = field(default_factory=list)  # weights now read by MatMulNBits
    kept_float: list[str] = field(default_factory=list)  # linear weights left float (the LM head when asked)


@dataclass(frozen=True)
class _Linear:
    node: ir.Node  # the MatMul or Gemm
    weight: ir.Value  # the initializer
    stored_nk: bool  # the initializer is [N, K] (read through a transpose), not MatMul's [K, N]
    bias: ir.Value | None = None  # [N], added to the product
    bias_add: ir.Node | None = None  # the Add of the bias after a MatMul, absorbed too


def _is_float_initializer(value: ir.Value | None) -> bool:
    return (
        value is not None and value.is_initializer() and value.dtype in _ACTIVATION_TYPES
        and value.shape is not None and len(value.shape) == 2 and all(isinstance(d, int) for d in value.shape)
    )


def _is_standard(node: ir.Node, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in ("", "ai.onnx")


def _int_attribute(node: ir.Node, name: str, default: int) -> int:
    attribute = node.attributes.get(name)
    return default if attribute is None else attribute.as_int()


def _float_attribute(node: ir.Node, name: str) -> float:
    attribute = node.attributes.get(name)
    return 1.0 if attribute is None else attribute.as_float()


def _weight(b: ir.Value | None, transposed: bool) -> tuple[ir.Value, bool] | None:
    """The initializer behind a MatMul's second input and whether it is stored [N, K]."""
    if _is_float_initializer(b):
        return b, transposed  # type: ignore[return-value]
    producer = b.producer() if b is not None else None
    if producer is not None and _is_standard(producer, "Transpose") and _is_float_initializer(producer.inputs[0]):
        perm = producer.attributes.get("perm")
        if perm is None or list(perm.as_ints()) == [1, 0]:
            return producer.inputs[0], not transposed  # type: ignore[return-value]
    return None


def _is_bias(value: ir.Value | None, n: int, dtype: ir.DataType | None) -> bool:
    return value is not None and value.dtype == dtype and value.shape is not None and list(value.shape) == [n]


def _bias_add(node: ir.Node, n: int, dtype: ir.DataType | None) -> tuple[ir.Value, ir.Node] | None:
    """The Add of a [N] bias that is the only use of a MatMul's product (nn.Linear's bias)."""
    uses = list(node.outputs[0].uses())
    if len(uses) != 1 or not _is_standard(uses[0][0], "Add") or node.outputs[0] in (node.graph.outputs if node.graph else []):
        return None
    add = uses[0][0]
    other = add.inputs[1 - uses[0][1]]
    return (other, add) if _is_bias(other, n, dtype) and other.is_initializer() else None  # type: ignore[return-value]


def _n(weight: ir.Value, stored_nk: bool) -> int:
    assert weight.shape is not None
    return int(weight.shape[0 if stored_nk else 1])


def _linear(node: ir.Node) -> _Linear | None:
    if _is_standard(node, "MatMul") and len(node.inputs) == 2:
        found = _weight(node.inputs[1], False)
        if found is None:
            return None
        weight, stored_nk = found
        bias = _bias_add(node, _n(weight, stored_nk), weight.dtype)
        return _Linear(node, weight, stored_nk, *(bias or (None, None)))
    if not _is_standard(node, "Gemm") or _int_attribute(node, "transA", 0) or _float_attribute(node, "alpha") != 1.0:
        return None
    found = _weight(node.inputs[1], bool(_int_attribute(node, "transB", 0)))
    if found is None:
        return None
    weight, stored_nk = found
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if bias is not None and (_float_attribute(node, "beta") != 1.0 or not _is_bias(bias, _n(weight, stored_nk), weight.dtype)):
        return None
    return _Linear(node, weight, stored_nk, bias)


def _lm_head(graph: ir.Graph, output_name: str) -> ir.Node | None:
    """The MatMul or Gemm computing the output ``output_name`` (through ops that only
    reshape, slice or cast it)."""
    value = next((v for v in graph.outputs if v.name == output_name), None)
    while value is not None:
        node = value.producer()
        if node is None:
            return None
        if node.op_type in ("MatMul", "Gemm"):
            return node
        if node.op_type not in ("Reshape", "Slice", "Cast", "Squeeze", "Unsqueeze", "Identity", "Gather"):
            return None
        value = node.inputs[0]
    return None


def _derive(linear: _Linear, config: WeightQuantization, names: list[str]):  # noqa: ANN202 - a Derive
    stored_nk = linear.stored_nk
    scales_type = _ACTIVATION_TYPES[linear.weight.dtype]  # type: ignore[index]

    def derive(stored: torch.Tensor) -> dict[str, torch.Tensor]:
        # MatMulNBits reads W as [N, K]: the transpose of MatMul's [K, N]
        packed = pack_weight(stored if stored_nk else stored.t(), config.bits, config.block_size, config.symmetric)
        outputs = {names[0]: packed.codes, names[1]: packed.scales.to(scales_type)}
        if packed.zero_points is not None:
            outputs[names[2]] = packed.zero_points
        return outputs

    return derive


def _fresh_name(graph: ir.Graph, wanted: str) -> str:
    name, count = wanted, 1
    while name in graph.initializers:
        name, count = f"{wanted}_{count}", count + 1
    return name


def _rewrite(graph: ir.Graph, linear: _Linear, config: WeightQuantization) -> None:
    weight = linear.weight
    assert weight.name is not None and weight.shape is not None and weight.dtype is not None
    rows, cols = (int(d) for d in weight.shape)
    n, k = (rows, cols) if linear.stored_nk else (cols, rows)
    suffixes = [f"_Q{config.bits}", "_scales"] + ([] if config.symmetric else ["_zero_points"])
    names = [_fresh_name(graph, weight.name + suffix) for suffix in suffixes]
    shapes = packed_shapes(n, k, config.bits, config.block_size)
    dtypes = [ir.DataType.UINT8, weight.dtype, ir.DataType.UINT8]
    group = DerivedGroup(weight, _derive(linear, config, names), names)
    inputs: list[ir.Value | None] = [linear.node.inputs[0]]
    for name, shape, dtype in zip(names, shapes, dtypes):
        tensor = DerivedTensor(group, name, dtype, ir.Shape(shape))
        value = ir.Value(name=name, shape=ir.Shape(shape), type=ir.TensorType(dtype), const_value=tensor)
        graph.register_initializer(value)
        inputs.append(value)
    if linear.bias is not None:  # inputs: A, B, scales, zero_points, g_idx, bias
        inputs += [None] * (5 - len(inputs)) + [linear.bias]
    attributes = {"K": k, "N": n, "bits": config.bits, "block_size": config.block_size, "accuracy_level": config.accuracy_level}
    node = ir.node("MatMulNBits", inputs, attributes, domain=MS_DOMAIN, name=linear.node.name)
    last = linear.bias_add or linear.node
    graph.insert_after(last, node)
    output, old = node.outputs[0], last.outputs[0]
    output.shape, output.type = old.shape, old.type
    old.replace_all_uses_with(output, replace_graph_outputs=True)
    name, old.name = old.name, None
    output.name = name  # a graph output keeps its name (`logits`)
    b = linear.node.inputs[1]
    for replaced in (linear.bias_add, linear.node):
        if replaced is not None:
            graph.remove(replaced, safe=True)
    producer = b.producer() if b is not None else None
    if producer is not None and not b.uses():  # the Transpose of a shared weight
        graph.remove(producer, safe=True)
    for value in (weight, linear.bias):
        if value is not None and value.is_initializer() and not value.uses():
            assert value.name is not None
            graph.initializers.pop(value.name)


def quantize_linear_weights(model: ir.Model, config: WeightQuantization, lm_head_output: str = "logits") -> QuantizedLinears:
    """Make every linear layer of ``model``'s main graph a ``MatMulNBits`` (weights
    computed when written; see the module docstring)."""
    graph = model.graph
    head = None if config.lm_head else _lm_head(graph, lm_head_output)
    report = QuantizedLinears()
    for linear in [found for node in list(graph) if (found := _linear(node)) is not None]:
        assert linear.weight.name is not None
        if linear.node is head:
            report.kept_float.append(linear.weight.name)
            continue
        _rewrite(graph, linear, config)
        report.quantized.append(linear.weight.name)
    if report.quantized and MS_DOMAIN not in model.opset_imports:
        model.opset_imports[MS_DOMAIN] = 1
    return report
