"""prims fmax/fmin/hypot/nextafter/frexp (dispatcher/functions/elementwise.py), exported
in tiny models, run in onnxruntime and compared with PyTorch bit for bit where PyTorch
is exact (NaN, signed zeros, infinities, subnormals, powers of two)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from conftest import Apply, export_program

NAN, INF = float("nan"), float("inf")
A = torch.tensor([1.0, -1.0, 0.0, -0.0, 1e-45, 3.0, NAN, 2.0, 0.5, -2.0, INF, -INF, 3.4e38, 1e-39, 1.5, 8.0, 1.0, 7e-39, NAN])
B = torch.tensor([2.0, -2.0, 1.0, -1.0, 0.0, NAN, 1.0, 0.0, -1.0, -3.0, 0.0, 0.0, INF, -1.0, 1.5, 0.0, 0.0, 1.0, NAN])


def _check_identical(function: Callable, *args: torch.Tensor) -> None:
    """Exported and run: same dtypes and values as PyTorch, NaN where PyTorch has NaN,
    the sign of zeros included."""
    program = export_program(Apply(function), args)
    got, want = program(*args), function(*args)
    got = got if isinstance(got, (list, tuple)) else [got]
    want = want if isinstance(want, (list, tuple)) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g = torch.as_tensor(g)
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
        if w.is_floating_point():
            assert torch.equal(torch.signbit(g), torch.signbit(w))


@pytest.mark.parametrize("name", ["fmax", "fmin", "hypot", "nextafter"])
def test_binary_prims_match_pytorch_exactly(name: str) -> None:
    function = getattr(torch, name)
    _check_identical(function, A, B)


@pytest.mark.parametrize("name", ["fmax", "fmin"])
def test_fmax_fmin_integers(name: str) -> None:
    a, b = torch.tensor([3, -2, 7, 0]), torch.tensor([1, 5, 7, -9])
    _check_identical(getattr(torch, name), a, b)


def test_nextafter_double() -> None:
    a, b = A.double(), B.double()
    _check_identical(torch.nextafter, a, b)


def test_frexp_mantissa_and_int32_exponent() -> None:
    x = torch.cat([A, B, torch.tensor([5e-40, -3.3e38, 0.75, 1024.0]), torch.randn(16) * 1e4])
    _check_identical(torch.frexp, x)
