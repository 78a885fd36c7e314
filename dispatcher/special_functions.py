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


# -- Bessel functions ---------------------------------------------------------------------


def _digamma_integer(k: int) -> float:
    """psi(k) for a positive integer k: -gamma + H_(k-1)."""
    return -_EULER_GAMMA + sum(1.0 / j for j in range(1, k))


def _bessel_series(t, order: int, alternating: bool):
    """sum_k (+-t)^k / (k! (k+order)!): J_order / I_order without the (x/2)^order factor."""
    sign = -1.0 if alternating else 1.0
    coefficients = [
        sign**k / (math.factorial(k) * math.factorial(k + order)) for k in range(_SERIES_TERMS)
    ]
    return _series(t, coefficients)


def _bessel_log_series(t, order: int, alternating: bool):
    """sum_k (psi(k+1) + psi(k+order+1)) (+-t)^k / (k! (k+order)!), the log-term partner of
    Y_order / K_order."""
    sign = -1.0 if alternating else 1.0
    coefficients = [
        sign**k
        * (_digamma_integer(k + 1) + _digamma_integer(k + order + 1))
        / (math.factorial(k) * math.factorial(k + order))
        for k in range(_SERIES_TERMS)
    ]
    return _series(t, coefficients)


def _hankel_coefficients(order: int) -> list[float]:
    """a_k(order) = prod_{j<=k} (4 order^2 - (2j-1)^2) / (k! 8^k)."""
    mu = 4.0 * order * order
    result = [1.0]
    for k in range(1, _ASYMPTOTIC_TERMS):
        result.append(result[-1] * (mu - (2 * k - 1) ** 2) / (k * 8.0))
    return result


def _inverse_powers(x, coefficients: Sequence[float], first_power: int, step: int):
    powers = [-float(first_power + step * k) for k in range(len(coefficients))]
    return _polynomial(x, coefficients, powers)


def _power_of_half(x, order: int):
    return op.Mul(x, 0.5) if order == 1 else _full_like(x, 1.0)


def _regular_series(x, order: int, alternating: bool):
    """(x/2)^order sum_k (+-x^2/4)^k / (k! (k+order)!): J_order (alternating) or I_order."""
    t = op.Mul(op.Mul(x, x), 0.25)
    return op.Mul(_power_of_half(x, order), _bessel_series(t, order, alternating))


def _log_partner_series(x, order: int, alternating: bool):
    """(x/2)^order sum_k (psi(k+1) + psi(k+order+1)) (+-x^2/4)^k / (k! (k+order)!)."""
    t = op.Mul(op.Mul(x, x), 0.25)
    return op.Mul(_power_of_half(x, order), _bessel_log_series(t, order, alternating))


def _odd_if_order_one(x, value, order: int):
    """J1 and I1 are odd: the value computed at |x| changes sign for x < 0."""
    if order == 1:
        return op.Where(op.Less(x, 0.0), op.Neg(value), value)
    return value


def _positive_domain(x, value, at_zero: float):
    """Y and K: ``at_zero`` at 0, NaN for x < 0."""
    value = op.Where(op.Equal(x, 0.0), _full_like(x, at_zero), value)
    return op.Where(op.Less(x, 0.0), _full_like(x, _NAN), value)


def _bessel_i_scaled(a, order: int):
    """exp(-a) I_order(a) for a >= 0."""
    series = op.Mul(_regular_series(op.Min(a, _BESSEL_IK_CROSSOVER), order, False), op.Exp(op.Neg(a)))
    coefficients = [(-1.0) ** k * c for k, c in enumerate(_hankel_coefficients(order))]
    large_a = op.Max(a, _BESSEL_IK_CROSSOVER)  # keeps the unused branch finite
    asymptotic = op.Div(
        _inverse_powers(large_a, coefficients, 0, 1), op.Sqrt(op.Mul(large_a, 2.0 * math.pi))
    )
    asymptotic = op.Where(op.IsInf(a), _full_like(a, 0.0), asymptotic)
    return op.Where(op.Less(a, _BESSEL_IK_CROSSOVER), series, asymptotic)


def _bessel_i(x, order: int, scaled: bool, like):
    a = op.Abs(x)
    value = _bessel_i_scaled(a, order)
    if not scaled:
        # PyTorch multiplies by exp(|x|) in the input's precision: inf once that overflows
        # (|x| > 88.7 in float32) even where I itself would still fit; NaN at +-inf.
        exp_a = op.Exp(a)
        value = op.Where(op.IsInf(_as_result(exp_a, like)), _full_like(a, _INF), op.Mul(value, exp_a))
        value = op.Where(op.IsInf(a), _full_like(a, _NAN), value)
    return _odd_if_order_one(x, value, order)


def _bessel_k_scaled(x, order: int):
    """exp(x) K_order(x) for x > 0; inf at 0, NaN below."""
    small_x = op.Min(x, _BESSEL_IK_CROSSOVER)
    log_half = op.Log(op.Mul(small_x, 0.5))
    i_value = _regular_series(small_x, order, False)
    log_part = _log_partner_series(small_x, order, False)
    if order == 0:
        series = op.Add(op.Neg(op.Mul(log_half, i_value)), op.Mul(log_part, 0.5))
    else:
        series = op.Add(op.Add(op.Reciprocal(small_x), op.Mul(log_half, i_value)), op.Mul(log_part, -0.5))
    series = op.Mul(series, op.Exp(small_x))
    large_x = op.Max(x, _BESSEL_IK_CROSSOVER)
    asymptotic = op.Mul(
        _inverse_powers(large_x, _hankel_coefficients(order), 0, 1),
        op.Sqrt(op.Div(math.pi / 2.0, large_x)),
    )
    return _positive_domain(x, op.Where(op.Less(x, _BESSEL_IK_CROSSOVER), series, asymptotic), _INF)


def _bessel_k(x, order: int, scaled: bool):
    value = _bessel_k_scaled(x, order)
    if not scaled:
        value = op.Where(op.IsInf(x), value, op.Mul(value, op.Exp(op.Neg(x))))
    return value


def _hankel_phase(a, order: int):
    """P, Q and the phase a - (order/2 + 1/4) pi of the large-argument J/Y expansion."""
    coefficients = _hankel_coefficients(order)
    p = [(-1.0) ** k * c for k, c in enumerate(coefficients[0::2])]
    q = [(-1.0) ** k * c for k, c in enumerate(coefficients[1::2])]
    return (
        _inverse_powers(a, p, 0, 2),
        _inverse_powers(a, q, 1, 2),
        op.Sub(a, (order / 2.0 + 0.25) * math.pi),
    )


def _bessel_j(x, order: int):
    a = op.Abs(x)
    series = _regular_series(op.Min(a, _BESSEL_JY_CROSSOVER), order, True)
    large_a = op.Max(a, _BESSEL_JY_CROSSOVER)
    p, q, phase = _hankel_phase(large_a, order)
    amplitude = op.Sqrt(op.Div(2.0 / math.pi, large_a))
    asymptotic = op.Mul(amplitude, op.Sub(op.Mul(p, op.Cos(phase)), op.Mul(q, op.Sin(phase))))
    return _odd_if_order_one(x, op.Where(op.Less(a, _BESSEL_JY_CROSSOVER), series, asymptotic), order)


def _bessel_y(x, order: int):
    small_x = op.Min(x, _BESSEL_JY_CROSSOVER)
    j_value = _regular_series(small_x, order, True)
    log_part = _log_partner_series(small_x, order, True)
    series = op.Sub(
        op.Mul(op.Log(op.Mul(small_x, 0.5)), op.Mul(j_value, 2.0 / math.pi)),
        op.Mul(log_part, 1.0 / math.pi),
    )
    if order == 1:
        series = op.Sub(series, op.Div(2.0 / math.pi, small_x))
    large_x = op.Max(x, _BESSEL_JY_CROSSOVER)
    p, q, phase = _hankel_phase(large_x, order)
    amplitude = op.Sqrt(op.Div(2.0 / math.pi, large_x))
    asymptotic = op.Mul(amplitude, op.Add(op.Mul(p, op.Sin(phase)), op.Mul(q, op.Cos(phase))))
    return _positive_domain(x, op.Where(op.Less(x, _BESSEL_JY_CROSSOVER), series, asymptotic), -_INF)


@_special("prims::bessel_i0", "aten::i0", "aten::special_i0", "aten::special_modified_bessel_i0")
def special_bessel_i0(self: TTensor) -> TTensor:
    return _as_result(_bessel_i(_as_double(self), 0, scaled=False, like=self), self)


@_special("prims::bessel_i1", "aten::special_i1", "aten::special_modified_bessel_i1")
def special_bessel_i1(self: TTensor) -> TTensor:
    return _as_result(_bessel_i(_as_double(self), 1, scaled=False, like=self), self)


@_special("prims::bessel_i0e", "aten::special_i0e")
def special_bessel_i0e(self: TTensor) -> TTensor:
    return _as_result(_bessel_i(_as_double(self), 0, scaled=True, like=self), self)


@_special("prims::bessel_i1e", "aten::special_i1e")
def special_bessel_i1e(self: TTensor) -> TTensor:
    return _as_result(_bessel_i(_as_double(self), 1, scaled=True, like=self), self)


@_special("prims::bessel_j0", "aten::special_bessel_j0")
def special_bessel_j0(self: TTensor) -> TTensor:
    return _as_result(_bessel_j(_as_double(self), 0), self)


@_special("prims::bessel_j1", "aten::special_bessel_j1")
def special_bessel_j1(self: TTensor) -> TTensor:
    return _as_result(_bessel_j(_as_double(self), 1), self)


@_special("aten::special_bessel_y0")
def special_bessel_y0(self: TTensor) -> TTensor:
    return _as_result(_bessel_y(_as_double(self), 0), self)


@_special("aten::special_bessel_y1")
def special_bessel_y1(self: TTensor) -> TTensor:
    return _as_result(_bessel_y(_as_double(self), 1), self)


@_special("aten::special_modified_bessel_k0")
def special_modified_bessel_k0(self: TTensor) -> TTensor:
    return _as_result(_bessel_k(_as_double(self), 0, scaled=False), self)


@_special("aten::special_modified_bessel_k1")
def special_modified_bessel_k1(self: TTensor) -> TTensor:
    return _as_result(_bessel_k(_as_double(self), 1, scaled=False), self)


@_special("aten::special_scaled_modified_bessel_k0")
def special_scaled_modified_bessel_k0(self: TTensor) -> TTensor:
    return _as_result(_bessel_k(_as_double(self), 0, scaled=True), self)


@_special("aten::special_scaled_modified_bessel_k1")
def special_scaled_modified_bessel_k1(self: TTensor) -> TTensor:
    return _as_result(_bessel_k(_as_double(self), 1, scaled=True), self)


@_special("prims::spherical_bessel_j0", "aten::special_spherical_bessel_j0")
def special_spherical_bessel_j0(self: TTensor) -> TTensor:
    x = _as_double(self)
    value = op.Div(op.Sin(x), x)
    value = op.Where(op.Equal(x, 0.0), _full_like(x, 1.0), value)
    # sin(x)/x -> 0 at +-inf, where sin gives NaN
    return _as_result(op.Where(op.IsInf(x), _full_like(x, 0.0), value), self)


# -- error function family ----------------------------------------------------------------
#
# ONNX Runtime has no float64 Erf, so erf is summed from its Taylor series for |x| <= 3
# and erfcx(x) = exp(x^2) erfc(x) comes from the continued fraction
# erfcx(x) = 1 / (sqrt(pi) (x + (1/2) / (x + 1 / (x + (3/2) / (x + ...))))) above 3.
# The inverses start from Winitzki's closed-form approximation (relative error ~2e-3)
# and take Newton steps on erfc written through erfcx, which stays precise in the tails.

_ERF_SWITCH = 3.0
_ERF_TERMS = 60
_ERFCX_DEPTH = 48
_NEWTON_STEPS = 3


def _erf_small(x):
    """erf(x) for |x| <= _ERF_SWITCH (x is clipped there)."""
    x = op.Clip(x, op.CastLike(-_ERF_SWITCH, x), op.CastLike(_ERF_SWITCH, x))
    coefficients = [
        2.0 / math.sqrt(math.pi) * (-1.0) ** k / (math.factorial(k) * (2 * k + 1)) for k in range(_ERF_TERMS)
    ]
    return op.Mul(x, _series(op.Mul(x, x), coefficients))


def _erfcx_large(x):
    """erfcx(x) for x >= _ERF_SWITCH (x is raised there)."""
    x = op.Max(x, _ERF_SWITCH)
    tail = op.Mul(x, 0.0)
    for k in range(_ERFCX_DEPTH, 0, -1):
        tail = op.Div(k / 2.0, op.Add(x, tail))
    return op.Div(1.0 / math.sqrt(math.pi), op.Add(x, tail))


def _erfcx_nonnegative(u):
    """erfcx(u) for u >= 0."""
    small = op.Mul(op.Exp(op.Mul(u, u)), op.Sub(1.0, _erf_small(u)))
    return op.Where(op.Less(u, _ERF_SWITCH), small, _erfcx_large(u))


def _erfcx(x):
    """erfcx(x) for every x: 2 exp(x^2) - erfcx(-x) below 0."""
    a = op.Abs(x)
    positive = _erfcx_nonnegative(a)
    negative = op.Sub(op.Mul(op.Exp(op.Mul(x, x)), 2.0), positive)
    value = op.Where(op.Less(x, 0.0), negative, positive)
    value = op.Where(op.Equal(x, -_INF), _full_like(x, _INF), value)
    return op.Where(op.Equal(x, _INF), _full_like(x, 0.0), value)


def _log_ndtr(x):
    """log(Phi(x)) = log(erfc(z) / 2) with z = -x / sqrt(2)."""
    z = op.Mul(x, -1.0 / math.sqrt(2.0))
    far_left = op.Sub(op.Log(op.Mul(_erfcx_nonnegative(op.Max(z, 0.0)), 0.5)), op.Mul(z, z))
    middle = op.Log(op.Mul(op.Sub(1.0, _erf_small(z)), 0.5))
    # Phi(x) = 1 - q with q = erfc(-z) / 2 tiny: log(1 - q) = -q - q^2/2 (q < 1e-5)
    minus_z = op.Max(op.Neg(z), 0.0)
    q = op.Mul(op.Mul(_erfcx_nonnegative(minus_z), op.Exp(op.Neg(op.Mul(minus_z, minus_z)))), 0.5)
    far_right = op.Sub(op.Neg(q), op.Mul(op.Mul(q, q), 0.5))
    value = op.Where(op.GreaterOrEqual(z, _ERF_SWITCH), far_left, middle)
    value = op.Where(op.Less(z, -_ERF_SWITCH), far_right, value)
    value = op.Where(op.Equal(x, _INF), _full_like(x, 0.0), value)
    return op.Where(op.Equal(x, -_INF), _full_like(x, -_INF), value)


def _inverse_erfc(c):
    """x with erfc(x) = c, for c in [0, 2]: inf at 0, -inf at 2, NaN outside."""
    inside = op.And(op.Greater(c, 0.0), op.Less(c, 2.0))
    safe_c = op.Where(inside, c, _full_like(c, 1.0))
    # Winitzki: erfinv(y) ~ sgn(y) sqrt(sqrt(b^2 - L/a) - b), b = 2/(pi a) + L/2, L = ln(1 - y^2)
    a = 0.147
    log_term = op.Log(op.Mul(safe_c, op.Sub(2.0, safe_c)))  # 1 - y^2 with y = 1 - c
    b = op.Add(op.Mul(log_term, 0.5), 2.0 / (math.pi * a))
    magnitude = op.Sqrt(op.Max(op.Sub(op.Sqrt(op.Sub(op.Mul(b, b), op.Div(log_term, a))), b), 0.0))
    x = op.Where(op.Greater(safe_c, 1.0), op.Neg(magnitude), magnitude)
    for _ in range(_NEWTON_STEPS):
        # erfc(x) = erfcx(|x|) exp(-x^2) for x >= 0 and 2 - that below
        growth = op.Exp(op.Mul(x, x))
        scaled = _erfcx_nonnegative(op.Abs(x))
        above = op.Sub(scaled, op.Mul(safe_c, growth))
        below = op.Sub(op.Mul(op.Sub(2.0, safe_c), growth), scaled)
        step = op.Where(op.GreaterOrEqual(x, 0.0), above, below)
        x = op.Add(x, op.Mul(step, math.sqrt(math.pi) / 2.0))
    x = op.Where(op.Equal(c, 0.0), _full_like(c, _INF), x)
    x = op.Where(op.Equal(c, 2.0), _full_like(c, -_INF), x)
    return op.Where(op.Or(inside, op.Or(op.Equal(c, 0.0), op.Equal(c, 2.0))), x, _full_like(c, _NAN))


@_special("aten::special_erfcx")
def special_erfcx(self: TTensor) -> TTensor:
    return _as_result(_erfcx(_as_double(self)), self)


@_special("aten::special_log_ndtr")
def special_log_ndtr(self: TTensor) -> TTensor:
    return _as_result(_log_ndtr(_as_double(self)), self)


@_special("prims::erf_inv", "aten::erfinv", "aten::special_erfinv")
def special_erfinv(self: TTensor) -> TTensor:
    return _as_result(_inverse_erfc(op.Sub(1.0, _as_double(self))), self)


@_special("prims::ndtri", "aten::special_ndtri")
def special_ndtri(self: TTensor) -> TTensor:
    return _as_result(op.Mul(_inverse_erfc(op.Mul(_as_double(self), 2.0)), -math.sqrt(2.0)), self)


# -- Airy function Ai ---------------------------------------------------------------------
#
# |x| < _AIRY_CROSSOVER: Maclaurin series Ai(x) = Ai(0) f(x) + Ai'(0) g(x) with
#   f = sum_k 3^k (1/3)_k x^(3k) / (3k)!, g = sum_k 3^k (2/3)_k x^(3k+1) / (3k+1)!;
# beyond, with zeta = 2/3 |x|^(3/2) and u_k = Gamma(3k + 1/2) / (54^k k! Gamma(k + 1/2)):
#   Ai(x) ~ exp(-zeta) / (2 sqrt(pi) x^(1/4)) sum_k (-1)^k u_k / zeta^k          (x > 0)
#   Ai(-z) ~ (sin(zeta + pi/4) P - cos(zeta + pi/4) Q) / (sqrt(pi) z^(1/4))        (x < 0)
#   P = sum_k (-1)^k u_2k / zeta^2k, Q = sum_k (-1)^k u_(2k+1) / zeta^(2k+1).

_AIRY_CROSSOVER = 6.0
_AIRY_TERMS = 40
_AIRY_ASYMPTOTIC_TERMS = 16


def _rising(a: float, k: int) -> float:
    """(a)_k = a (a+1) ... (a+k-1)."""
    return math.prod(a + j for j in range(k))


def _airy_ai(x):
    small_x = op.Clip(x, op.CastLike(-_AIRY_CROSSOVER, x), op.CastLike(_AIRY_CROSSOVER, x))
    cube = op.Mul(op.Mul(small_x, small_x), small_x)
    f = _series(cube, [3.0**k * _rising(1 / 3, k) / math.factorial(3 * k) for k in range(_AIRY_TERMS)])
    g = _series(cube, [3.0**k * _rising(2 / 3, k) / math.factorial(3 * k + 1) for k in range(_AIRY_TERMS)])
    ai_0 = 1.0 / (3.0 ** (2.0 / 3.0) * math.gamma(2.0 / 3.0))
    ai_prime_0 = -1.0 / (3.0 ** (1.0 / 3.0) * math.gamma(1.0 / 3.0))
    series = op.Add(op.Mul(f, ai_0), op.Mul(op.Mul(g, small_x), ai_prime_0))
    z = op.Max(op.Abs(x), _AIRY_CROSSOVER)
    zeta = op.Mul(op.Mul(z, op.Sqrt(z)), 2.0 / 3.0)
    u = [
        math.exp(math.lgamma(3 * k + 0.5) - math.lgamma(k + 0.5) - math.lgamma(k + 1)) / 54.0**k
        for k in range(_AIRY_ASYMPTOTIC_TERMS)
    ]
    quarter = op.Sqrt(op.Sqrt(z))
    decaying = op.Div(
        op.Mul(op.Exp(op.Neg(zeta)), _inverse_powers(zeta, [(-1.0) ** k * c for k, c in enumerate(u)], 0, 1)),
        op.Mul(quarter, 2.0 * math.sqrt(math.pi)),
    )
    p = _inverse_powers(zeta, [(-1.0) ** k * c for k, c in enumerate(u[0::2])], 0, 2)
    q = _inverse_powers(zeta, [(-1.0) ** k * c for k, c in enumerate(u[1::2])], 1, 2)
    phase = op.Add(zeta, math.pi / 4.0)
    oscillating = op.Div(
        op.Sub(op.Mul(op.Sin(phase), p), op.Mul(op.Cos(phase), q)), op.Mul(quarter, math.sqrt(math.pi))
    )
    asymptotic = op.Where(op.Less(x, 0.0), oscillating, decaying)
    value = op.Where(op.Less(op.Abs(x), _AIRY_CROSSOVER), series, asymptotic)
    # PyTorch gives NaN at +-inf
    return op.Where(op.IsInf(x), _full_like(x, _NAN), value)


@_special("aten::special_airy_ai")
def special_airy_ai(self: TTensor) -> TTensor:
    return _as_result(_airy_ai(_as_double(self)), self)


# -- signbit (copysign) ------------------------------------------------------------------


@_special("prims::signbit", "aten::signbit")
def special_signbit(self: TTensor) -> TTensor:
    """x < 0, and -0.0 (1/x = -inf). The sign of a NaN cannot be read in ONNX: False."""
    x = _as_double(self)
    negative_zero = op.And(op.Equal(x, 0.0), op.Less(op.Reciprocal(x), 0.0))
    return op.Or(op.Less(x, 0.0), negative_zero)
