"""A matrix product of two dequantized operands as an integer matrix product.

PT2E's quantizers (torchao's X86 quantizer among them) leave a quantized linear layer as
``MatMul(DequantizeLinear(q), DequantizeLinear(W))`` with nothing quantized after it, a
form onnxruntime has no fused kernel for: it dequantizes the weight on every run and
multiplies in float, slower than the float model. The same product in integers is

    (q - zq) * sq @ (W - zW) * sW  =  (sq * sW) * MatMulInteger(q, W, zq, zW)

(per-tensor ``sq``; ``sW`` per tensor or per output column), which onnxruntime runs with
its integer kernels (its ``MatMulIntegerToFloat`` fusion wants a scale computed at run
time; these stored ones are folded into one, and the float scaling stays a ``Mul``). The
integer sum is exact; the result differs from the dequantized float product by float
rounding only.

A linear layer on a 2-D input is translated as ``Gemm(DequantizeLinear(q),
DequantizeLinear(W), bias, transB=1)``, which onnxruntime fuses only when its output is
quantized again (``QGemm``, a ``Relu`` in between too): such a Gemm stays. Any other
`gemms_of_dequantized_as_matmuls` makes ``MatMul(.., Transpose(DequantizeLinear(W))) +
bias`` first, so that the weight is stored transposed (`weight_layout`) and the product
becomes integer like any other.

Inside module functions the weight and its quantization parameters are parameters: they
count as stored when every call gives them stored tensors (`function_calls`), and
`dequantized_arguments` has already moved the dequantization into the function that
multiplies.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

from fx2onnx.onnx_passes.function_calls import FunctionCalls
from fx2onnx.onnx_passes.linear_layers import take_place
from fx2onnx.onnx_passes.model_graphs import model_nodes

_INTEGER_TYPES = (ir.DataType.INT8, ir.DataType.UINT8)


def _scalar(value: ir.Value | None) -> bool:
    return value is not None and value.shape is not None and value.shape.numpy() in ((), (1,))


def _axis(dequantized: ir.Value) -> int:
    node = dequantized.producer()
    assert node is not None
    return node.attributes.get_int("axis", 1)


class IntegerMatMulOfDequantized(RewriteRuleClassBase):
    """``MatMul(DequantizeLinear(q, sq, zq), DequantizeLinear(W, sW, zW))`` with a stored
    2-D ``W`` quantized per tensor or per output column, as an integer product scaled."""

    def __init__(self, calls: FunctionCalls) -> None:
        super().__init__()
        self._stored = calls.is_stored

    def pattern(self, op, q, q_scale, q_zero, weight, w_scale, w_zero):
        left = op.DequantizeLinear(q, q_scale, q_zero, _allow_other_attributes=True)
        right = op.DequantizeLinear(weight, w_scale, w_zero, _allow_other_attributes=True, _outputs=["right"])
        return op.MatMul(left, right)

    def check(self, context, q, q_scale, q_zero, weight, w_scale, w_zero, right, **_) -> MatchResult:
        result = MatchResult()
        if q.dtype not in _INTEGER_TYPES or weight.dtype not in _INTEGER_TYPES:
            return result.fail("Operands are not 8-bit integers.")
        if weight.shape is None or len(weight.shape) != 2 or not self._stored(weight):
            return result.fail("The right operand is not a stored matrix.")
        if not (_scalar(q_scale) and self._stored(q_zero) and _scalar(q_zero)):
            return result.fail("The left operand is not quantized per tensor.")
        if not (self._stored(w_zero) and self._stored(w_scale)):
            return result.fail("The weight's quantization parameters are not stored.")
        per_column = not _scalar(w_scale)
        if per_column and _axis(right) % 2 != 1:
            return result.fail("The weight is quantized along its rows, not its output columns.")
        if w_scale.dtype != ir.DataType.FLOAT or q_scale.dtype != ir.DataType.FLOAT:
            return result.fail("Scales are not float32.")
        return result

    def rewrite(self, op, q, q_scale, q_zero, weight, w_scale, w_zero, **_):
        product = op.MatMulInteger(q, weight, q_zero, w_zero)
        return op.Mul(op.Cast(product, to=ir.DataType.FLOAT), op.Mul(q_scale, w_scale))


def _is_dequantized(value: ir.Value | None) -> bool:
    producer = value.producer() if value is not None else None
    return producer is not None and producer.op_type == "DequantizeLinear" and producer.domain in ("", "ai.onnx")


def _plain_gemm_of_dequantized(node: ir.Node, calls: FunctionCalls) -> bool:
    """A Gemm ``A @ op(B) + C`` (no transposed A, no scaling) of two dequantized operands."""
    if node.op_type != "Gemm" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return False
    attributes = node.attributes
    if attributes.get_int("transA", 0) or attributes.get_float("alpha", 1.0) != 1.0 or attributes.get_float("beta", 1.0) != 1.0:
        return False
    weight = node.inputs[1]
    if not (_is_dequantized(node.inputs[0]) and _is_dequantized(weight)) or _quantized_again(node.outputs[0], calls):
        return False
    return calls.is_stored(weight.producer().inputs[0])  # type: ignore[union-attr]  # an integer product needs a stored weight


def _quantized_again(value: ir.Value, calls: FunctionCalls) -> bool:
    """Every use of ``value`` (through a Relu, through function calls) is a
    QuantizeLinear: onnxruntime's QGemm form."""
    uses = calls.final_uses(value)
    if len(uses) == 1 and uses[0][0].op_type == "Relu" and uses[0][0].domain in ("", "ai.onnx"):
        uses = calls.final_uses(uses[0][0].outputs[0])
    return bool(uses) and all(node.op_type == "QuantizeLinear" for node, _ in uses)


def gemms_of_dequantized_as_matmuls(model: ir.Model) -> None:
    """Make every plain Gemm of two dequantized operands (graph and functions) a MatMul,
    its ``transB`` a Transpose and its C an Add, in place (see the module docstring)."""
    calls = FunctionCalls(model)
    for node in [n for n in model_nodes(model) if _plain_gemm_of_dequantized(n, calls)]:
        owner = node.graph
        assert owner is not None
        a, b = node.inputs[0], node.inputs[1]
        new = []
        if node.attributes.get_int("transB", 0):
            new.append(ir.node("Transpose", [b], {"perm": [1, 0]}, name=f"{node.name}/transB"))
            b = new[-1].outputs[0]
        new.append(ir.node("MatMul", [a, b], name=f"{node.name}/MatMul"))
        c = node.inputs[2] if len(node.inputs) > 2 else None
        if c is not None:
            new.append(ir.node("Add", [new[-1].outputs[0], c], name=f"{node.name}/C"))
        owner.insert_before(node, new)
        take_place(node.outputs[0], new[-1].outputs[0])
        owner.remove(node, safe=True)


def integer_matmuls(model: ir.Model) -> None:
    """Rewrite every matrix product of dequantized 8-bit operands in ``model`` (graph and
    functions) as an integer product, in place."""
    from onnxscript.rewriter import RewritePass, RewriteRuleSet

    RewritePass(RewriteRuleSet([IntegerMatMulOfDequantized.rule(FunctionCalls(model))]))(model)
