"""A matrix product of two dequantized operands as an integer matrix product.

PT2E's quantizers (torchao's X86 quantizer among them) leave a quantized linear layer as
``MatMul(DequantizeLinear(q), DequantizeLinear(W))`` with nothing quantized after it, a
form onnxruntime has no fused kernel for: it dequantizes the weight on every run and
multiplies in float, slower than the float model. The same product in integers is

    (q - zq) * sq @ (W - zW) * sW  =  (sq * sW) * MatMulInteger(q, W, zq, zW)

(per-tensor ``sq``; ``sW`` per tensor or per output column), which onnxruntime runs with
its integer kernels and fuses into ``MatMulIntegerToFloat``. The integer sum is exact; the
result differs from the dequantized float product by float rounding only.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

_INTEGER_TYPES = (ir.DataType.INT8, ir.DataType.UINT8)


def _scalar(value: ir.Value | None) -> bool:
    return value is not None and value.shape is not None and value.shape.numpy() in ((), (1,))


def _stored(value: ir.Value | None) -> bool:
    return value is not None and (value.is_initializer() or value.const_value is not None)


def _axis(dequantized: ir.Value) -> int:
    node = dequantized.producer()
    assert node is not None
    return node.attributes.get_int("axis", 1)


class IntegerMatMulOfDequantized(RewriteRuleClassBase):
    """``MatMul(DequantizeLinear(q, sq, zq), DequantizeLinear(W, sW, zW))`` with a stored
    2-D ``W`` quantized per tensor or per output column, as an integer product scaled."""

    def pattern(self, op, q, q_scale, q_zero, weight, w_scale, w_zero):
        left = op.DequantizeLinear(q, q_scale, q_zero, _allow_other_attributes=True)
        right = op.DequantizeLinear(weight, w_scale, w_zero, _allow_other_attributes=True, _outputs=["right"])
        return op.MatMul(left, right)

    def check(self, context, q, q_scale, q_zero, weight, w_scale, w_zero, right, **_) -> MatchResult:
        result = MatchResult()
        if q.dtype not in _INTEGER_TYPES or weight.dtype not in _INTEGER_TYPES:
            return result.fail("Operands are not 8-bit integers.")
        if weight.shape is None or len(weight.shape) != 2 or not _stored(weight):
            return result.fail("The right operand is not a stored matrix.")
        if not (_scalar(q_scale) and _stored(q_zero) and _scalar(q_zero)):
            return result.fail("The left operand is not quantized per tensor.")
        if not (_stored(w_zero) and _stored(w_scale)):
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


def integer_matmuls(model: ir.Model) -> None:
    """Rewrite every matrix product of dequantized 8-bit operands in ``model`` (graph and
    functions) as an integer product, in place."""
    from onnxscript.rewriter import RewritePass, RewriteRuleSet

    RewritePass(RewriteRuleSet([IntegerMatMulOfDequantized.rule()]))(model)
