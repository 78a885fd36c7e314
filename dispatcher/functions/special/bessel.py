"""Bessel functions of the first and second kind, modified and scaled ones, and the spherical j0."""

from __future__ import annotations

import math
from collections.abc import Sequence
from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.tensor_typing import TTensor
from dispatcher.functions.special.gamma import _ASYMPTOTIC_TERMS, _BESSEL_IK_CROSSOVER, _BESSEL_JY_CROSSOVER, _EULER_GAMMA, _INF, _NAN, _SERIES_TERMS, _as_double, _as_result, _full_like, _polynomial, _series, _special

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
