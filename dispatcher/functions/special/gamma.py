"""Special functions torchlib lacks: lgamma, digamma/polygamma, Hurwitz zeta, the
regularized incomplete gamma functions, the Bessel family, Airy Ai, the error-function
family (erfcx, log_ndtr and the inverses erfinv, ndtri), and signbit (for copysign).

PyTorch decomposes ``lgamma``, ``digamma``, ``special.zeta``, ``igamma``, ``igammac``,
``i0``, ``special.i0e/i1/i1e``, ``special.bessel_j0/j1`` and
``special.spherical_bessel_j0`` into ``prims::`` operators and keeps ``polygamma``,
``special.bessel_y0/y1`` and the ``special.*modified_bessel*`` operators as they are;
ONNX has none of them. Each is written here from ONNX arithmetic:

- every function computes in float64 and casts the result back to the input's float
  type (integer and bool inputs give float32, as in PyTorch), so that series with
  cancelling terms keep float32 accuracy;
- gamma-type functions shift a small argument up with the recurrence
  ``f(x) = f(x + N) - (terms for x .. x + N - 1)``, evaluate a Stirling-type asymptotic
  series at ``x + N``, and use the reflection formula for ``x < 1/2``;
- the incomplete gamma P(a, x) is its power series for ``x < a + 1`` and 1 - Q(a, x)
  from Legendre's continued fraction (evaluated from a fixed depth) above;
- Bessel functions use their power series for small ``|x|`` and their large-argument
  (Hankel) expansions beyond a crossover, picked with ``Where``. A series is one
  vectorized evaluation: the argument gains a trailing axis of powers, is multiplied
  by coefficients computed in Python when the function is traced, and summed.

Values at the edges (0, poles, infinities, negative arguments of Y and K) follow
PyTorch's. :data:`SPECIAL_FUNCTIONS` lists (qualified ATen names, function); the
registry adds them after torchlib's functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import onnx_ir as ir
from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.tensor_typing import TTensor

from dispatcher.function_table import FunctionTable

__all__ = ["SPECIAL_FUNCTIONS", "SPECIAL_DOMAIN"]

SPECIAL_DOMAIN = "pkg.fx2onnx.special"
_TABLE = FunctionTable(SPECIAL_DOMAIN)

SPECIAL_FUNCTIONS = _TABLE.entries

_special = _TABLE.op

_DOUBLE = ir.DataType.DOUBLE.value
_FLOAT = ir.DataType.FLOAT.value
_EULER_GAMMA = 0.5772156649015329
_INF = float("inf")
_NAN = float("nan")

# Bernoulli numbers B_2, B_4, ..., B_16 (for the Stirling and Euler-Maclaurin tails).
_BERNOULLI_EVEN = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6, -3617 / 510)

# Below the crossover a Bessel function is summed from its power series, above it from
# its large-argument expansion; both keep a relative error far under float32's there.
_BESSEL_IK_CROSSOVER = 9.0
_BESSEL_JY_CROSSOVER = 12.0
_SERIES_TERMS = 48
_ASYMPTOTIC_TERMS = 18
_GAMMA_SHIFT = 8
# Terms of the incomplete gamma series and depth of its continued fraction: enough for
# float32 accuracy while a stays below a few thousand (both converge in ~sqrt(a) steps).
_INCOMPLETE_GAMMA_TERMS = 256
# Hurwitz zeta: terms summed directly until q + k reaches _ZETA_SHIFT; a negative q adds
# terms up to that point, at most _ZETA_MAX_SHIFT (q below about -4000 is not supported).
_ZETA_SHIFT = 12
_ZETA_MAX_SHIFT = 4096
_INCOMPLETE_GAMMA_DEPTH = 64


# -- helpers ------------------------------------------------------------------------------


def _as_double(x):
    return op.Cast(x, to=_DOUBLE)


def _as_result(value, x):
    """The float64 result in the input's dtype; integer and bool inputs give float32."""
    dtype = getattr(x, "dtype", None)
    if dtype is not None and ir.DataType(dtype).is_floating_point():
        return op.CastLike(value, x)
    return op.Cast(value, to=_FLOAT)


def _full_like(x, value: float):
    return op.CastLike(op.Constant(value_float=value), x)


def _polynomial(t, coefficients: Sequence[float], powers: Sequence[float]):
    """sum_k coefficients[k] * t ** powers[k], evaluated on a trailing axis of powers."""
    expanded = op.Unsqueeze(t, [-1])
    terms = op.Mul(op.Pow(expanded, op.CastLike(list(powers), t)), list(coefficients))
    return op.ReduceSum(terms, [-1], keepdims=0)


def _series(t, coefficients: Sequence[float]):
    """sum_k coefficients[k] * t ** k."""
    return _polynomial(t, coefficients, [float(k) for k in range(len(coefficients))])


def _largest(values, at_least: float):
    """The largest element, and at least ``at_least`` (also for an empty tensor), as a 0-d
    tensor: a length for Range."""
    flat = op.Reshape(values, op.Constant(value_ints=[-1]))
    return op.ReduceMax(op.Concat(flat, op.CastLike([at_least], values), axis=0), keepdims=0)


def _fraction(x):
    """x minus its nearest integer, in [-1/2, 1/2]: exact in float64 (tiny x stay tiny), and
    all that |sin(pi x)| and cot(pi x) depend on (both have period 1)."""
    return op.Sub(x, op.Round(x))


def _is_pole(x):
    """x is a non-positive integer (or -inf): where gamma has its poles."""
    return op.And(op.LessOrEqual(x, 0.0), op.Equal(op.Floor(x), x))


# -- lgamma -------------------------------------------------------------------------------


def _lgamma_at_least_half(y):
    """log|Gamma(y)| for y >= 1/2: shifted by N, then Stirling's series."""
    shift = [float(k) for k in range(_GAMMA_SHIFT)]
    log_product = op.ReduceSum(op.Log(op.Add(op.Unsqueeze(y, [-1]), shift)), [-1], keepdims=0)
    z = op.Add(y, float(_GAMMA_SHIFT))
    stirling = op.Add(
        op.Sub(op.Mul(op.Sub(z, 0.5), op.Log(z)), z), 0.5 * math.log(2.0 * math.pi)
    )
    coefficients = [b / ((2 * k + 2) * (2 * k + 1)) for k, b in enumerate(_BERNOULLI_EVEN)]
    powers = [-(2.0 * k + 1.0) for k in range(len(_BERNOULLI_EVEN))]
    tail = _polynomial(z, coefficients, powers)
    return op.Sub(op.Add(stirling, tail), log_product)


def _lgamma(x):
    small = op.Less(x, 0.5)
    y = op.Where(small, op.Sub(1.0, x), x)
    main = _lgamma_at_least_half(y)
    # log|Gamma(x)| = log(pi / |sin(pi x)|) - log|Gamma(1 - x)|; inf at the poles.
    sine = op.Abs(op.Sin(op.Mul(_fraction(x), math.pi)))
    reflected = op.Sub(op.Log(op.Div(math.pi, sine)), main)
    result = op.Where(small, reflected, main)
    return op.Where(op.IsInf(x), _full_like(x, _INF), result)


@_special("prims::lgamma", "aten::lgamma")
def special_lgamma(self: TTensor) -> TTensor:
    return _as_result(_lgamma(_as_double(self)), self)


# -- digamma and polygamma ----------------------------------------------------------------


def _cot_derivative_polynomial(n: int) -> list[float]:
    """Coefficients (by power of c) of P_n with d^n/dx^n cot(pi x) = pi^n P_n(cot(pi x))."""
    poly = [0.0, 1.0]
    for _ in range(n):
        derivative = [k * poly[k] for k in range(1, len(poly))] or [0.0]
        # -(1 + c^2) * P'(c)
        nxt = [0.0] * (len(derivative) + 2)
        for k, a in enumerate(derivative):
            nxt[k] -= a
            nxt[k + 2] -= a
        poly = nxt
    return poly


def _polygamma_at_least_half(n: int, y):
    """psi^(n)(y) for y >= 1/2: recurrence up by N, then the asymptotic series at y + N."""
    shift_count = 10 + n
    shift = [float(k) for k in range(shift_count)]
    shifted = op.Add(op.Unsqueeze(y, [-1]), shift)
    recurrence = op.ReduceSum(op.Pow(shifted, op.CastLike(float(-(n + 1)), y)), [-1], keepdims=0)
    z = op.Add(y, float(shift_count))
    if n == 0:
        # psi(z) ~ log z - 1/(2z) - sum_k B_2k / (2k z^2k)
        coefficients = [-0.5] + [-b / (2 * k + 2) for k, b in enumerate(_BERNOULLI_EVEN)]
        powers = [-1.0] + [-(2.0 * k + 2.0) for k in range(len(_BERNOULLI_EVEN))]
        asymptotic = op.Add(op.Log(z), _polynomial(z, coefficients, powers))
        return op.Sub(asymptotic, recurrence)
    # psi^(n)(z) ~ (-1)^(n+1) [(n-1)!/z^n + n!/(2 z^(n+1)) + sum_k B_2k (2k+n-1)!/(2k)! / z^(2k+n)]
    sign = -1.0 if n % 2 == 0 else 1.0
    coefficients = [sign * math.factorial(n - 1), sign * math.factorial(n) / 2.0]
    powers = [-float(n), -float(n + 1)]
    for k, b in enumerate(_BERNOULLI_EVEN, start=1):
        coefficients.append(sign * b * math.factorial(2 * k + n - 1) / math.factorial(2 * k))
        powers.append(-float(2 * k + n))
    asymptotic = _polynomial(z, coefficients, powers)
    # psi^(n)(y) = psi^(n)(y + N) - (-1)^n n! sum_k (y + k)^-(n+1)
    return op.Sub(asymptotic, op.Mul(recurrence, -sign * math.factorial(n)))


def _polygamma(n: int, x):
    small = op.Less(x, 0.5)
    y = op.Where(small, op.Sub(1.0, x), x)
    main = _polygamma_at_least_half(n, y)
    # psi^(n)(x) = (-1)^n psi^(n)(1 - x) - pi^(n+1) P_n(cot(pi x))
    angle = op.Mul(_fraction(x), math.pi)
    cot = op.Div(op.Cos(angle), op.Sin(angle))
    poly = _cot_derivative_polynomial(n)
    cot_term = _polynomial(cot, [c * math.pi ** (n + 1) for c in poly], [float(k) for k in range(len(poly))])
    reflected = op.Sub(op.Mul(main, (-1.0) ** n), cot_term)
    result = op.Where(small, reflected, main)
    if n == 0:
        # digamma: -inf at +0, inf at -0 (the sign of 1/x), NaN at the other poles and -inf
        at_pole = op.Where(op.Equal(x, 0.0), op.Neg(op.Reciprocal(x)), _full_like(x, _NAN))
    else:
        at_pole = _full_like(x, _INF if n % 2 == 1 else -_INF)
    return op.Where(_is_pole(x), at_pole, result)


@_special("prims::digamma", "aten::digamma")
def special_digamma(self: TTensor) -> TTensor:
    return _as_result(_polygamma(0, _as_double(self)), self)


@_special("aten::polygamma", "aten::special_polygamma")
def special_polygamma(n: int, self: TTensor) -> TTensor:
    if n < 0:
        raise ValueError(f"polygamma is defined for n >= 0 only, got n={n}")
    return _as_result(_polygamma(n, _as_double(self)), self)


# -- Hurwitz zeta -------------------------------------------------------------------------


def _broadcast(a, b):
    shape = op.Shape(op.Add(a, b))
    return op.Expand(a, shape), op.Expand(b, shape)


def _hurwitz_zeta(x, q):
    """zeta(x, q) = sum_k (q + k)^-x: the first m terms (m brings q + m to at least
    _ZETA_SHIFT; a trailing axis as long as the largest m) and the Euler-Maclaurin tail
    at w = q + m."""
    x, q = _broadcast(x, q)
    shift = op.Min(op.Max(op.Ceil(op.Sub(float(_ZETA_SHIFT), q)), float(_ZETA_SHIFT)), float(_ZETA_MAX_SHIFT))
    shift = op.Where(op.IsNaN(shift), _full_like(shift, float(_ZETA_SHIFT)), shift)
    steps = op.Range(op.CastLike(0.0, q), _largest(shift, float(_ZETA_SHIFT)), op.CastLike(1.0, q))
    k = op.Add(op.Unsqueeze(op.Mul(q, 0.0), [-1]), steps)
    terms = op.Pow(op.Add(op.Unsqueeze(q, [-1]), k), op.Unsqueeze(op.Neg(x), [-1]))
    used = op.Less(k, op.Unsqueeze(shift, [-1]))
    head = op.ReduceSum(op.Where(used, terms, op.Mul(k, 0.0)), [-1], keepdims=0)
    w = op.Add(q, shift)
    log_w = op.Log(w)
    tail = op.Add(
        op.Div(op.Exp(op.Mul(op.Sub(1.0, x), log_w)), op.Sub(x, 1.0)),
        op.Mul(op.Exp(op.Mul(op.Neg(x), log_w)), 0.5),
    )
    # sum_j B_2j / (2j)! * x (x+1) ... (x+2j-2) * w^(-x-2j+1), in logarithms
    count = len(_BERNOULLI_EVEN)
    factors = op.Add(op.Unsqueeze(x, [-1]), [float(i) for i in range(2 * count - 1)])
    rising = op.CumSum(op.Log(factors), op.Constant(value_int=-1))
    rising = op.Gather(rising, op.Constant(value_ints=[2 * j for j in range(count)]), axis=-1)
    exponents = op.Sub(op.Neg(op.Unsqueeze(x, [-1])), [2.0 * j + 1.0 for j in range(count)])
    logs = op.Add(rising, op.Mul(exponents, op.Unsqueeze(log_w, [-1])))
    coefficients = [b / math.factorial(2 * j + 2) for j, b in enumerate(_BERNOULLI_EVEN)]
    euler_maclaurin = op.ReduceSum(op.Mul(op.Exp(logs), coefficients), [-1], keepdims=0)
    value = op.Add(op.Add(head, tail), euler_maclaurin)
    # PyTorch: inf at x == 1 and at q = 0, -1, -2, ...; NaN for x < 1, for a negative q with
    # a non-integer x, and for an infinite x or q.
    inf, nan = _full_like(x, _INF), _full_like(x, _NAN)
    value = op.Where(op.And(op.Less(q, 0.0), op.Not(op.Equal(op.Floor(x), x))), nan, value)
    value = op.Where(op.And(op.LessOrEqual(q, 0.0), op.Equal(op.Floor(q), q)), inf, value)
    value = op.Where(op.Less(x, 1.0), nan, value)
    value = op.Where(op.Equal(x, 1.0), inf, value)
    value = op.Where(op.Or(op.IsInf(x), op.IsInf(q)), nan, value)
    return value


@_special("prims::zeta", "aten::special_zeta")
def special_zeta(self: TTensor, other: TTensor) -> TTensor:
    return _as_result(_hurwitz_zeta(_as_double(self), _as_double(other)), self)


# -- regularized incomplete gamma ---------------------------------------------------------


def _lower_gamma_series(a, x, log_prefix):
    """P(a, x) = x^a e^-x / Gamma(a + 1) * sum_k x^k / ((a+1) ... (a+k)), for x < a + 1.

    The products are cumulative sums of logarithms along a trailing axis of k."""
    steps = [float(j) for j in range(1, _INCOMPLETE_GAMMA_TERMS)]
    ratios = op.Div(op.Unsqueeze(x, [-1]), op.Add(op.Unsqueeze(a, [-1]), steps))
    products = op.Exp(op.CumSum(op.Log(ratios), op.Constant(value_int=-1)))
    total = op.Add(op.ReduceSum(products, [-1], keepdims=0), 1.0)
    return op.Div(op.Mul(op.Exp(log_prefix), total), a)


def _upper_gamma_fraction(a, x, log_prefix):
    """Q(a, x) = x^a e^-x / Gamma(a) / (x+1-a - 1(1-a)/(x+3-a - 2(2-a)/(x+5-a - ...))),
    for x >= a + 1, the continued fraction evaluated from a fixed depth upwards."""
    tail = op.Mul(x, 0.0)
    for n in range(_INCOMPLETE_GAMMA_DEPTH, 0, -1):
        numerator = op.Mul(op.Sub(float(n), a), float(n))
        tail = op.Div(numerator, op.Sub(op.Add(op.Sub(x, a), 2.0 * n + 1.0), tail))
    return op.Div(op.Exp(log_prefix), op.Sub(op.Add(op.Sub(x, a), 1.0), tail))


def _incomplete_gamma(a, x, upper: bool):
    """P(a, x) (or Q = 1 - P when ``upper``) with PyTorch's values at the edges."""
    a, x = _broadcast(a, x)
    # keep the unused branch and the edges finite; they are replaced below
    safe_a = op.Where(op.Greater(a, 0.0), op.Min(a, 1e300), _full_like(a, 1.0))
    safe_x = op.Where(op.Greater(x, 0.0), op.Min(x, 1e300), _full_like(x, 1.0))
    log_prefix = op.Sub(op.Sub(op.Mul(safe_a, op.Log(safe_x)), safe_x), _lgamma(safe_a))
    use_series = op.Less(safe_x, op.Add(safe_a, 1.0))
    series_x = op.Where(use_series, safe_x, _full_like(safe_x, 0.5))
    fraction_x = op.Where(use_series, op.Add(safe_a, 1.0), safe_x)
    lower = _lower_gamma_series(safe_a, series_x, log_prefix)
    upper_value = _upper_gamma_fraction(safe_a, fraction_x, log_prefix)
    p = op.Where(use_series, lower, op.Sub(1.0, upper_value))
    # Edges, as PyTorch: P(0, x > 0) = 1, P(a > 0, 0) = 0, P(a, inf) = 1, P(inf, x) = 0.
    one, zero = _full_like(a, 1.0), _full_like(a, 0.0)
    p = op.Where(op.Equal(x, 0.0), zero, p)
    p = op.Where(op.IsInf(x), one, p)
    p = op.Where(op.IsInf(a), zero, p)
    p = op.Where(op.Equal(a, 0.0), one, p)
    invalid = op.Or(
        op.Or(op.Or(op.Less(a, 0.0), op.Less(x, 0.0)), op.Or(op.IsNaN(a), op.IsNaN(x))),
        op.Or(op.And(op.Equal(a, 0.0), op.Equal(x, 0.0)), op.And(op.IsInf(a), op.IsInf(x))),
    )
    p = op.Where(invalid, _full_like(a, _NAN), p)
    if not upper:
        return p
    q = op.Where(use_series, op.Sub(1.0, lower), upper_value)
    at_edge = op.Or(op.Or(op.Equal(x, 0.0), op.Equal(a, 0.0)), op.Or(op.IsInf(x), op.IsInf(a)))
    q = op.Where(at_edge, op.Sub(1.0, p), q)
    return op.Where(invalid, _full_like(a, _NAN), q)


@_special("prims::igamma", "aten::igamma", "aten::special_gammainc")
def special_igamma(self: TTensor, other: TTensor) -> TTensor:
    return _as_result(_incomplete_gamma(_as_double(self), _as_double(other), upper=False), self)


@_special("prims::igammac", "aten::igammac", "aten::special_gammaincc")
def special_igammac(self: TTensor, other: TTensor) -> TTensor:
    return _as_result(_incomplete_gamma(_as_double(self), _as_double(other), upper=True), self)
