"""``cross_entropy_loss`` with class-probability targets.

torchlib writes ``cross_entropy_loss`` with ONNX ``SoftmaxCrossEntropyLoss``, which takes
class indices only; PyTorch also accepts a floating target of the input's shape, each
entry the probability of a class. Then the loss of a sample is
``-sum_c weight[c] * target[c] * log_softmax(input)[c]`` (after label smoothing:
``target * (1 - s) + s / C``), and the ``mean`` reduction divides by the number of
samples (not by the weights). The function takes floating targets only, so integer
targets keep torchlib's. :data:`LOSS_FUNCTIONS` lists (qualified ATen names, function).
"""

from __future__ import annotations

from typing import Optional

from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.tensor_typing import TFloat

from dispatcher.function_table import FunctionTable
from dispatcher.traced_values import scalar_like

__all__ = ["LOSS_FUNCTIONS", "LOSS_DOMAIN"]

LOSS_DOMAIN = "pkg.fx2onnx.loss"
_TABLE = FunctionTable(LOSS_DOMAIN)

LOSS_FUNCTIONS = _TABLE.entries

_NONE, _MEAN, _SUM = 0, 1, 2  # PyTorch's Reduction enum


@_TABLE.op("aten::cross_entropy_loss")
def cross_entropy_with_probabilities(
    self: TFloat,
    target: TFloat,
    weight: Optional[TFloat] = None,
    reduction: int = _MEAN,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> TFloat:
    rank = len(self.shape)
    class_axis = 1 if rank >= 2 else 0
    log_probabilities = op.LogSoftmax(self, axis=class_axis)
    if label_smoothing > 0.0:
        classes = op.CastLike(op.Shape(self, start=class_axis, end=class_axis + 1), self)
        keep = scalar_like(1.0 - label_smoothing, self)
        spread = op.Div(scalar_like(label_smoothing, self), classes)
        target = op.Add(op.Mul(target, keep), spread)
    terms = op.Mul(target, log_probabilities)
    if weight is not None:
        per_class = op.Reshape(weight, op.Constant(value_ints=[-1] + [1] * (rank - class_axis - 1)))
        terms = op.Mul(terms, per_class)
    loss = op.Neg(op.ReduceSum(terms, op.Constant(value_ints=[class_axis]), keepdims=0))
    if reduction == _NONE:
        return loss
    if reduction == _SUM:
        return op.ReduceSum(loss, keepdims=0)
    return op.ReduceMean(loss, keepdims=0)
