"""Orthogonal polynomials of ``torch.special`` evaluated for a degree ``n`` that is data.

``chebyshev_polynomial_{t,u,v,w}`` (and their ``shifted_`` forms on ``2x - 1``),
``hermite_polynomial_{h,he}``, ``laguerre_polynomial_l`` and ``legendre_polynomial_p``
take the degree per element, unknown at export time. Each function follows PyTorch's
kernel: ``n`` is truncated to an integer, ``n < 0`` gives 0, degrees 0 and 1 are
closed, ``|x| == 1`` (Chebyshev, Legendre) and ``x == 0`` (Laguerre) have exact values,
Chebyshev of a high degree inside ``(-1, 1)`` uses its trigonometric form, Hermite above
PyTorch's degree limit is NaN, and every other element runs the three-term recurrence.

The recurrence is one ONNX ``Loop`` whose trip count is the largest degree any element
needs; its single carried tensor stacks ``[x, n, p, q, result]`` on a new first axis
(the tracing evaluator gives one output per variadic ONNX output, so one carried value
keeps the Loop's outputs known), and each element's result is taken at the iteration
where the degree reaches its ``n``. Integer and bool inputs compute in float32, as in
PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir
from onnxscript import opset18 as op

from dispatcher._types import FLOAT_TYPES
from dispatcher.function_table import FunctionTable
from onnxscript.function_libs.torch_lib.tensor_typing import TReal, TFloat

__all__ = ["POLYNOMIAL_FUNCTIONS", "POLYNOMIAL_DOMAIN"]

POLYNOMIAL_DOMAIN = "pkg.fx2onnx.polynomials"
_TABLE = FunctionTable(POLYNOMIAL_DOMAIN)

POLYNOMIAL_FUNCTIONS = _TABLE.entries

_poly_op = _TABLE.op

_INT64 = ir.DataType.INT64.value

# PyTorch returns NaN for Hermite degrees above this limit (per floating type).
_HERMITE_LIMITS = {ir.DataType.FLOAT: 128, ir.DataType.DOUBLE: 512}
_HERMITE_LIMIT_OTHER = 1024

# Slots of the Loop's carried tensor.
_X, _N, _P, _Q, _RESULT = range(5)


# -- inputs -------------------------------------------------------------------------------


def _dtype(value) -> ir.DataType | None:
    return getattr(value, "dtype", None)


def _common_inputs(x, n):
    """x and n as tensors of the result's floating type (PyTorch's promotion; integers
    and bools compute in float32), n truncated toward zero as PyTorch's kernel does."""
    x_type, n_type = _dtype(x), _dtype(n)
    floats = [t for t in (x_type, n_type) if t in FLOAT_TYPES]
    if not floats:
        target = ir.DataType.FLOAT
    elif len(floats) == 2 and floats[0] != floats[1]:
        target = max(floats, key=lambda t: t.itemsize)
    else:
        target = floats[0]
    x = x if x_type == target else op.Cast(x, to=target.value)
    n = op.Cast(op.Cast(n, to=_INT64), to=target.value) if n_type in FLOAT_TYPES or n_type is None else n
    n = n if _dtype(n) == target else op.Cast(n, to=target.value)
    # Both broadcast to the result's shape.
    shape = op.Shape(op.Add(x, n))
    return op.Expand(x, shape), op.Expand(n, shape), target


def _number(value: float, like):
    return op.CastLike(op.Constant(value_float=value), like)


# -- the recurrence as an ONNX Loop -------------------------------------------------------

# step(tape, x, c, p, q) -> the next value, where c = degree - 1 of that value (a float
# scalar tensor), p and q the values of degrees c - 1 and c.
Step = Callable[[ir.tape.Tape, ir.Value, ir.Value, ir.Value, ir.Value], ir.Value]


def _body(dtype: ir.DataType, step: Step) -> ir.Graph:
    """The Loop body: from [x, n, p, q, result] at degree c, compute degree c + 1 and keep
    it as the result of the elements whose n is that degree."""
    tape = ir.tape.Tape()
    iteration = ir.Value(name="iteration", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
    condition = ir.Value(name="condition", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    state = ir.Value(name="state", type=ir.TensorType(dtype))

    def constant(value, value_dtype):
        return tape.op("Constant", [], attributes={"value": ir.tensor(value, dtype=value_dtype)})

    def slot(index: int) -> ir.Value:
        return tape.op("Gather", [state, constant(index, ir.DataType.INT64)], attributes={"axis": 0})

    x, n, p, q, result = (slot(i) for i in (_X, _N, _P, _Q, _RESULT))
    one = constant(1.0, dtype)
    c = tape.op("Add", [tape.op("Cast", [iteration], attributes={"to": dtype.value}), one])
    r = step(tape, x, c, p, q)
    degree = tape.op("Add", [c, one])
    result = tape.op("Where", [tape.op("Equal", [n, degree]), r, result])
    axis0 = constant([0], ir.DataType.INT64)
    pieces = [tape.op("Unsqueeze", [v, axis0]) for v in (x, n, q, r, result)]
    new_state = tape.op("Concat", pieces, attributes={"axis": 0})
    condition_out = tape.op("Identity", [condition])
    return ir.Graph(
        inputs=[iteration, condition, state],
        outputs=[condition_out, new_state],
        nodes=tape.nodes,
        opset_imports={"": 18},
        name="polynomial_recurrence",
    )


def _recurrence(x, n, p0, p1, needed, step: Step, dtype: ir.DataType):
    """Degree n of the recurrence started from p0 (degree 0) and p1 (degree 1), for the
    elements where ``needed``; the Loop runs up to the largest such n."""
    zero = _number(0.0, x)
    needed_degrees = op.Where(needed, n, zero)
    flat = op.Concat(op.Reshape(needed_degrees, op.Constant(value_ints=[-1])), op.Reshape(zero, op.Constant(value_ints=[-1])), axis=0)
    trips = op.Cast(op.Sub(op.ReduceMax(flat, keepdims=0), _number(1.0, x)), to=_INT64)
    trips = op.Max(trips, op.Constant(value_int=0))
    shape = op.Shape(x)
    p0, p1 = op.Expand(p0, shape), op.Expand(p1, shape)
    result = op.Where(op.Equal(n, zero), p0, op.Where(op.Equal(n, _number(1.0, x)), p1, op.Expand(zero, shape)))
    axis0 = op.Constant(value_ints=[0])
    state = op.Concat(*(op.Unsqueeze(v, axis0) for v in (x, n, p0, p1, result)), axis=0)
    final = op.Loop(trips, op.Constant(value=ir.tensor(True)), state, body=_body(dtype, step))
    return op.Gather(final, op.Constant(value_int=_RESULT), axis=0)


def _steps_chebyshev(y2: Callable) -> Step:
    """Chebyshev's step r = (y + y) q - p, where y2(tape, x) builds y + y."""

    def step(tape, x, c, p, q):
        return tape.op("Sub", [tape.op("Mul", [y2(tape, x), q]), p])

    return step


def _twice(tape, x):
    return tape.op("Add", [x, x])


def _parity_sign(n):
    """1 for even n, -1 for odd n (n integral)."""
    two = _number(2.0, n)
    odd = op.Equal(op.Sub(n, op.Mul(two, op.Floor(op.Div(n, two)))), _number(1.0, n))
    return op.Where(odd, _number(-1.0, n), _number(1.0, n))


# -- Chebyshev ----------------------------------------------------------------------------


def _chebyshev(kind: str, y, n, threshold: float, dtype: ir.DataType):
    """Chebyshev polynomial of the given kind at y (already shifted), PyTorch's kernel."""
    one = _number(1.0, y)
    zero = _number(0.0, y)
    two_y = op.Add(y, y)
    starts = {"t": y, "u": two_y, "v": op.Sub(two_y, one), "w": op.Add(two_y, one)}
    p1 = starts[kind]
    inside = op.Less(op.Abs(y), one)
    trigonometric = op.And(op.Greater(n, _number(threshold, y)), inside)
    recursive = op.Not(trigonometric)
    value = _recurrence(y, n, one, p1, recursive, _steps_chebyshev(_twice), dtype)

    theta = op.Acos(op.Where(inside, y, zero))  # inside only: Acos of |y| > 1 is NaN anyway
    sign = _parity_sign(n)
    n_plus_one = op.Add(n, one)
    two_n_plus_one = op.Add(op.Add(n, n), one)
    half = _number(0.5, y)
    if kind == "t":
        closed = op.Cos(op.Mul(n, theta))
        at_one = one
        at_minus_one = sign
    elif kind == "u":
        sin_theta = op.Sin(theta)
        closed = op.Where(
            op.Equal(sin_theta, zero),
            op.Div(op.Mul(n_plus_one, op.Cos(op.Mul(n_plus_one, theta))), y),
            op.Div(op.Sin(op.Mul(n_plus_one, theta)), sin_theta),
        )
        at_one = n_plus_one
        at_minus_one = op.Mul(sign, n_plus_one)
    elif kind == "v":
        half_theta = op.Mul(theta, half)
        closed = op.Where(
            op.Equal(op.Sin(half_theta), one),
            op.Mul(sign, two_n_plus_one),
            op.Div(op.Cos(op.Mul(op.Add(n, half), theta)), op.Cos(half_theta)),
        )
        at_one = one
        at_minus_one = op.Mul(sign, two_n_plus_one)
    else:  # "w"
        half_theta = op.Mul(theta, half)
        closed = op.Where(
            op.Equal(op.Cos(half_theta), one),
            op.Where(op.Greater(y, zero), two_n_plus_one, sign),
            op.Div(op.Sin(op.Mul(op.Add(n, half), theta)), op.Sin(half_theta)),
        )
        at_one = two_n_plus_one
        at_minus_one = sign
    value = op.Where(trigonometric, closed, value)
    value = op.Where(op.Equal(y, op.Neg(one)), at_minus_one, value)
    value = op.Where(op.Equal(y, one), at_one, value)
    return op.Where(op.Less(n, zero), zero, value)


def _chebyshev_of(kind: str, x, n, shifted: bool):
    x, n, dtype = _common_inputs(x, n)
    if shifted:
        # PyTorch evaluates the shifted polynomials at x + x - 1, with degree 6 as the
        # limit of the recurrence inside (-1, 1) for every kind.
        return _chebyshev(kind, op.Sub(op.Add(x, x), _number(1.0, x)), n, 6.0, dtype)
    return _chebyshev(kind, x, n, 6.0 if kind == "t" else 8.0, dtype)


# -- Hermite, Laguerre, Legendre ----------------------------------------------------------


def _hermite_h_step(tape, x, c, p, q):
    # H_{c+1} = 2x H_c - 2c H_{c-1}
    return tape.op("Sub", [tape.op("Mul", [tape.op("Add", [x, x]), q]), tape.op("Mul", [tape.op("Add", [c, c]), p])])


def _hermite_he_step(tape, x, c, p, q):
    # He_{c+1} = x He_c - c He_{c-1}
    return tape.op("Sub", [tape.op("Mul", [x, q]), tape.op("Mul", [c, p])])


def _laguerre_step(tape, x, c, p, q):
    # L_{c+1} = ((2c + 1 - x) L_c - c L_{c-1}) / (c + 1)
    one = tape.op("CastLike", [tape.op("Constant", [], attributes={"value": ir.tensor(1.0)}), x])
    first = tape.op("Mul", [tape.op("Add", [tape.op("Add", [c, c]), tape.op("Sub", [one, x])]), q])
    return tape.op("Div", [tape.op("Sub", [first, tape.op("Mul", [c, p])]), tape.op("Add", [c, one])])


def _legendre_step(tape, x, c, p, q):
    # P_{c+1} = ((2c + 1) x P_c - c P_{c-1}) / (c + 1)
    one = tape.op("CastLike", [tape.op("Constant", [], attributes={"value": ir.tensor(1.0)}), x])
    first = tape.op("Mul", [tape.op("Mul", [tape.op("Add", [tape.op("Add", [c, c]), one]), x]), q])
    return tape.op("Div", [tape.op("Sub", [first, tape.op("Mul", [c, p])]), tape.op("Add", [c, one])])


def _hermite(x, n, physicists: bool):
    x, n, dtype = _common_inputs(x, n)
    one, zero = _number(1.0, x), _number(0.0, x)
    limit = _number(float(_HERMITE_LIMITS.get(dtype, _HERMITE_LIMIT_OTHER)), x)
    beyond = op.Greater(n, limit)
    p1 = op.Add(x, x) if physicists else x
    step = _hermite_h_step if physicists else _hermite_he_step
    value = _recurrence(x, n, one, p1, op.Not(beyond), step, dtype)
    value = op.Where(beyond, _number(float("nan"), x), value)
    return op.Where(op.Less(n, zero), zero, value)


def _laguerre(x, n):
    x, n, dtype = _common_inputs(x, n)
    one, zero = _number(1.0, x), _number(0.0, x)
    at_zero = op.Equal(x, zero)
    value = _recurrence(x, n, one, op.Sub(one, x), op.Not(at_zero), _laguerre_step, dtype)
    value = op.Where(at_zero, one, value)
    return op.Where(op.Less(n, zero), zero, value)


def _legendre(x, n):
    x, n, dtype = _common_inputs(x, n)
    one, zero = _number(1.0, x), _number(0.0, x)
    at_one = op.Equal(op.Abs(x), one)
    value = _recurrence(x, n, one, x, op.Not(at_one), _legendre_step, dtype)
    at_one_value = op.Where(op.Greater(x, zero), one, _parity_sign(n))
    value = op.Where(at_one, at_one_value, value)
    return op.Where(op.Less(n, zero), zero, value)


# -- the ATen operators -------------------------------------------------------------------
# Each operator has three overloads: both tensors (.default), a Python number x
# (.x_scalar) or a Python number n (.n_scalar); the numbers become constants.


def _register(name: str, compute: Callable) -> None:
    def default(x: TReal, n: TReal) -> TFloat:
        return compute(x, n)

    def x_scalar(x: float, n: TReal) -> TFloat:
        return compute(op.Constant(value_float=float(x)), n)

    def n_scalar(x: TReal, n: float) -> TFloat:
        return compute(x, op.Constant(value_float=float(n)))

    for suffix, function in (("", default), (".x_scalar", x_scalar), (".n_scalar", n_scalar)):
        function.__name__ = f"{name}{suffix.replace('.', '_')}"
        function.__qualname__ = function.__name__
        _poly_op(f"aten::{name}{suffix}")(function)


for _kind in "tuvw":
    _register(
        f"special_chebyshev_polynomial_{_kind}",
        lambda x, n, kind=_kind: _chebyshev_of(kind, x, n, shifted=False),
    )
    _register(
        f"special_shifted_chebyshev_polynomial_{_kind}",
        lambda x, n, kind=_kind: _chebyshev_of(kind, x, n, shifted=True),
    )
_register("special_hermite_polynomial_h", lambda x, n: _hermite(x, n, physicists=True))
_register("special_hermite_polynomial_he", lambda x, n: _hermite(x, n, physicists=False))
_register("special_laguerre_polynomial_l", _laguerre)
_register("special_legendre_polynomial_p", _legendre)
