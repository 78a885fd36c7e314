"""ONNX functions for the Python functions torch.export leaves on symbolic sizes (and for
transformers' own operators, which torchlib does not cover either).

Sizes computed from dynamic dims stay in the FX graph as calls of ``torch.sym_float``,
``torch.sym_int``, ``torch.sym_max`` / ``sym_min``, ``torch.sym_ite`` and the math
replacements ``torch._sym_sqrt``, ``torch._sym_cos``... (what ``math.sqrt`` of a size
becomes). torchlib covers the ``operator`` and ``math.floor/ceil/trunc`` builtins, not
these. A SymInt travels as a 0-d INT64 tensor, a SymFloat as a 0-d DOUBLE tensor (a
Python float is a double: a size computed as ``int(height * scale)`` is eager's only in
double arithmetic), a SymBool as a 0-d BOOL tensor; Python numbers arrive as they are.

:data:`SYMBOLIC_FUNCTIONS` lists (qualified names, function); the registry adds them
after torchlib's functions.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
from onnxscript import opset18 as op

from dispatcher.function_table import FunctionTable

__all__ = ["SYMBOLIC_FUNCTIONS", "SYMBOLIC_DOMAIN"]

SYMBOLIC_DOMAIN = "pkg.fx2onnx.symbolic"
_TABLE = FunctionTable(SYMBOLIC_DOMAIN)
_DOUBLE = ir.DataType.DOUBLE.value
_INT64 = ir.DataType.INT64.value
_BOOL = ir.DataType.BOOL.value

SYMBOLIC_FUNCTIONS = _TABLE.entries

_symbolic = _TABLE.op


def _is_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    dtype = getattr(value, "dtype", None)
    return dtype is not None and dtype.is_floating_point()


def _common(a: Any, b: Any) -> tuple[Any, Any]:
    """Both operands as DOUBLE when one is a float, else as INT64 (Python's promotion)."""
    to = _DOUBLE if _is_float(a) or _is_float(b) else _INT64
    return op.Cast(a, to=to), op.Cast(b, to=to)


@_symbolic("torch::sym_float")
def sym_float(self):
    return op.Cast(self, to=_DOUBLE)


@_symbolic("_operator::truediv")
def truediv(self, other):
    # Python's `/` of sizes: a double
    return op.Div(op.Cast(self, to=_DOUBLE), op.Cast(other, to=_DOUBLE))


@_symbolic("torch::sym_int")
def sym_int(self):
    # Cast from float to int truncates toward zero, as int() does
    return op.Cast(self, to=_INT64)


@_symbolic("torch::sym_max")
def sym_max(self, other):
    a, b = _common(self, other)
    return op.Max(a, b)


@_symbolic("torch::sym_min")
def sym_min(self, other):
    a, b = _common(self, other)
    return op.Min(a, b)


@_symbolic("torch::sym_ite")
def sym_ite(condition, then_value, else_value):
    a, b = _common(then_value, else_value)
    return op.Where(op.Cast(condition, to=_BOOL), a, b)


@_symbolic("torch::sym_not")
def sym_not(self):
    return op.Not(op.Cast(self, to=_BOOL))


def _unary_float(name: str, onnx_op: Any) -> None:
    def function(self):
        return onnx_op(op.Cast(self, to=_DOUBLE))

    function.__name__ = function.__qualname__ = f"sym_{name}"
    _symbolic(f"torch::_sym_{name}")(function)


for _name, _op in {
    "sqrt": op.Sqrt, "cos": op.Cos, "cosh": op.Cosh, "sin": op.Sin, "sinh": op.Sinh, "tan": op.Tan,
    "tanh": op.Tanh, "asin": op.Asin, "acos": op.Acos, "atan": op.Atan,
}.items():
    _unary_float(_name, _op)


@_symbolic("torch::sym_sum")
def sym_sum(args):
    # the sizes arrive concatenated into one 1-d tensor
    return op.ReduceSum(args, keepdims=0)


@_symbolic("torch::_sym_log2")
def sym_log2(self):
    return op.Div(op.Log(op.Cast(self, to=_DOUBLE)), op.Log(op.Cast(op.Constant(value_float=2.0), to=_DOUBLE)))


# -- transformers' own operators ------------------------------------------------------------
# transformers wraps its mixture-of-experts matmul loop in a custom operator so that
# torch.compile leaves it whole; torch.export keeps it as one node.
@_symbolic("transformers::grouped_mm_fallback")
def grouped_mm_fallback(input, weight, offs):
    """Rows [offs[e-1], offs[e]) of `input` (S, K), sorted by expert, times weight[e]
    (E, K, N); rows after offs[-1] are zero. Each row gathers its expert's matrix."""
    count = op.Squeeze(op.Shape(input, start=0, end=1), op.Constant(value_ints=[0]))
    rows = op.Unsqueeze(op.Range(op.Constant(value_int=0), count, op.Constant(value_int=1)), op.Constant(value_ints=[1]))  # (S, 1)
    offsets = op.Unsqueeze(op.Cast(offs, to=_INT64), op.Constant(value_ints=[0]))  # (1, E)
    expert = op.ReduceSum(op.Cast(op.GreaterOrEqual(rows, offsets), to=_INT64), op.Constant(value_ints=[1]), keepdims=0)
    experts = op.Shape(weight, start=0, end=1)
    inside = op.Less(expert, experts)  # rows past the last offset belong to no expert
    last = op.Sub(experts, op.Constant(value_ints=[1]))
    matrices = op.Gather(weight, op.Min(expert, last), axis=0)  # (S, K, N)
    product = op.Squeeze(op.MatMul(op.Unsqueeze(input, op.Constant(value_ints=[1])), matrices), op.Constant(value_ints=[1]))
    mask = op.Unsqueeze(op.Cast(inside, to=_BOOL), op.Constant(value_ints=[1]))
    return op.Where(mask, product, op.CastLike(op.Constant(value_float=0.0), product))
