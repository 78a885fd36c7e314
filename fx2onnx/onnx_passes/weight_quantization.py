"""Weight-only quantization of linear layers: ``MatMul(x, W)`` -> ``com.microsoft.MatMulNBits``.

The runtime's own CPU form of an int4 or int8 LLM (what ONNX Runtime GenAI's model
builder writes for ``-p int4 -e cpu``): each linear layer keeps float activations and
reads its weight as block-wise integer codes with a scale per block (`nbits_packing`).
At accuracy level 4 onnxruntime's CPU kernel quantizes the activations to int8 on the
fly and multiplies in integers, which is where the speed comes from.

A linear layer is a MatMul whose second input is a 2-D float initializer, read as it is
(stored in MatMul's layout, see `weight_layout`) or through ``Transpose(perm=[1, 0])``
(a weight shared with an embedding, which keeps PyTorch's layout). Its codes and scales
are `DerivedTensor`s: computed from the weight when the model is written, one weight at
a time, from the program's weight or the checkpoint's (fake mode). The float weight goes
when nothing else reads it; an embedding's Gather keeps reading a shared one.
"""

from __future__ import annotations

from collections.abc import Iterator
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
    node: ir.Node
    weight: ir.Value  # the initializer
    through_transpose: bool


def _is_float_initializer(value: ir.Value | None) -> bool:
    return (
        value is not None and value.is_initializer() and value.dtype in _ACTIVATION_TYPES
        and value.shape is not None and len(value.shape) == 2 and all(isinstance(d, int) for d in value.shape)
    )


def _linears(graph: ir.Graph) -> Iterator[_Linear]:
    for node in graph:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
            continue
        b = node.inputs[1]
        if _is_float_initializer(b):
            yield _Linear(node, b, False)  # type: ignore[arg-type]
            continue
        producer = b.producer() if b is not None else None
        if producer is not None and producer.op_type == "Transpose" and producer.domain in ("", "ai.onnx"):
            perm = producer.attributes.get("perm")
            if (perm is None or list(perm.as_ints()) == [1, 0]) and _is_float_initializer(producer.inputs[0]):
                yield _Linear(node, producer.inputs[0], True)  # type: ignore[arg-type]


def _lm_head(graph: ir.Graph, output_name: str) -> ir.Node | None:
    """The MatMul computing the output ``output_name`` (through ops that only reshape,
    slice or cast it)."""
    value = next((v for v in graph.outputs if v.name == output_name), None)
    while value is not None:
        node = value.producer()
        if node is None:
            return None
        if node.op_type == "MatMul":
            return node
        if node.op_type not in ("Reshape", "Slice", "Cast", "Squeeze", "Unsqueeze", "Identity", "Gather"):
            return None
        value = node.inputs[0]
    return None


def _derive(linear: _Linear, config: WeightQuantization, names: list[str]):  # noqa: ANN202 - a Derive
    through_transpose = linear.through_transpose

    def derive(stored: torch.Tensor) -> dict[str, torch.Tensor]:
        # MatMulNBits reads W as [N, K]: the transpose of MatMul's [K, N]
        read = stored.t() if through_transpose else stored
        packed = pack_weight(read.t(), config.bits, config.block_size, config.symmetric)
        outputs = {names[0]: packed.codes, names[1]: packed.scales.to(_ACTIVATION_TYPES[linear.weight.dtype])}  # type: ignore[index]
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
    k, n = (cols, rows) if linear.through_transpose else (rows, cols)
    suffixes = [f"_Q{config.bits}", "_scales"] + ([] if config.symmetric else ["_zero_points"])
    names = [_fresh_name(graph, weight.name + suffix) for suffix in suffixes]
    shapes = packed_shapes(n, k, config.bits, config.block_size)
    dtypes = [ir.DataType.UINT8, weight.dtype, ir.DataType.UINT8]
    group = DerivedGroup(weight, _derive(linear, config, names), names)
    inputs = [linear.node.inputs[0]]
    for name, shape, dtype in zip(names, shapes, dtypes):
        tensor = DerivedTensor(group, name, dtype, ir.Shape(shape))
        value = ir.Value(name=name, shape=ir.Shape(shape), type=ir.TensorType(dtype), const_value=tensor)
        graph.register_initializer(value)
        inputs.append(value)
    attributes = {"K": k, "N": n, "bits": config.bits, "block_size": config.block_size, "accuracy_level": config.accuracy_level}
    node = ir.node("MatMulNBits", inputs, attributes, domain=MS_DOMAIN, name=linear.node.name)
    graph.insert_after(linear.node, node)
    output = node.outputs[0]
    old = linear.node.outputs[0]
    output.shape, output.type = old.shape, old.type
    old.replace_all_uses_with(output, replace_graph_outputs=True)
    name, old.name = old.name, None
    output.name = name  # a graph output keeps its name (`logits`)
    transposed = linear.node.inputs[1]
    graph.remove(linear.node, safe=True)
    if linear.through_transpose and transposed is not None and not transposed.uses():
        producer = transposed.producer()
        assert producer is not None
        graph.remove(producer, safe=True)
    if not weight.uses():
        graph.initializers.pop(weight.name)


def quantize_linear_weights(model: ir.Model, config: WeightQuantization, lm_head_output: str = "logits") -> QuantizedLinears:
    """Make every linear layer of ``model``'s main graph a ``MatMulNBits`` (weights
    computed when written; see the module docstring)."""
    graph = model.graph
    head = None if config.lm_head else _lm_head(graph, lm_head_output)
    report = QuantizedLinears()
    for linear in list(_linears(graph)):
        assert linear.weight.name is not None
        if linear.node is head:
            report.kept_float.append(linear.weight.name)
            continue
        _rewrite(graph, linear, config)
        report.quantized.append(linear.weight.name)
    if report.quantized and MS_DOMAIN not in model.opset_imports:
        model.opset_imports[MS_DOMAIN] = 1
    return report
