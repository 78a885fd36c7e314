"""The error function family: erf, erfc, erfcx, log_ndtr, ndtr, ndtri and erfinv, in float64 where onnxruntime has no Erf."""

from __future__ import annotations

import math
from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.tensor_typing import TTensor
from dispatcher.functions.special.gamma import _INF, _NAN, _as_double, _as_result, _full_like, _series, _special
from dispatcher.functions.special.bessel import _inverse_powers

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
