"""The ATen operators of LU, solves, inverse, Cholesky, triangular solves and QR, built from the steps in `steps`."""

from __future__ import annotations

from typing import Any
import numpy as np
import onnx_ir as ir
from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.tensor_typing import INT32, TFloat
from dispatcher.functions.linalg.steps import _batch_shape, _cholesky, _column, _expand_matrix, _eye, _householder_qr, _index, _linalg_op, _lu_factor, _lu_solve, _mT, _np_dtype, _rank, _row_order, _scalar, _solve_triangular, _solve_triangular_left, _static_size

# -- functions ----------------------------------------------------------------------------


@_linalg_op("aten::linalg_lu_factor_ex")
def linalg_lu_factor_ex(A: TFloat, pivot: bool = True, check_errors: bool = False) -> tuple[TFloat, INT32, INT32]:
    m = _static_size(A, -2, "linalg_lu_factor_ex")
    n = _static_size(A, -1, "linalg_lu_factor_ex")
    return _lu_factor(A, m, n, pivot)


@_linalg_op("aten::linalg_lu_solve")
def linalg_lu_solve(LU: TFloat, pivots: INT32, B: TFloat, left: bool = True, adjoint: bool = False) -> TFloat:
    n = _static_size(LU, -1, "linalg_lu_solve")
    return _lu_solve(LU, pivots, B, n, left, adjoint)


@_linalg_op("aten::lu_solve")
def lu_solve(self: TFloat, LU_data: TFloat, LU_pivots: INT32) -> TFloat:
    n = _static_size(LU_data, -1, "lu_solve")
    return _lu_solve(LU_data, LU_pivots, self, n, True, False)


def _is_vector_rhs(a: Any, b: Any) -> bool:
    """PyTorch's rule: B is a (batch of) vector(s) when 1-D or shaped like A without its last dim."""
    return _rank(b) == 1 or (_rank(b) == _rank(a) - 1 and tuple(b.shape) == tuple(a.shape)[:-1])


@_linalg_op("aten::_linalg_solve_ex")
def linalg_solve_ex(
    A: TFloat, B: TFloat, left: bool = True, check_errors: bool = False
) -> tuple[TFloat, TFloat, INT32, INT32]:
    n = _static_size(A, -1, "linalg_solve")
    vector = _is_vector_rhs(A, B)
    b = op.Unsqueeze(B, _index(-1)) if vector else B
    # As PyTorch does for real matrices: factor A^T and solve with its transpose.
    lu, pivots, info = _lu_factor(_mT(A), n, n, True)
    x = _lu_solve(lu, pivots, b, n, left, adjoint=True)
    if vector:
        x = op.Squeeze(x, _index(-1))
    return x, lu, pivots, info


@_linalg_op("aten::linalg_inv_ex")
def linalg_inv_ex(A: TFloat, check_errors: bool = False) -> tuple[TFloat, INT32]:
    n = _static_size(A, -1, "linalg_inv")
    lu, pivots, info = _lu_factor(_mT(A), n, n, True)
    identity = _expand_matrix(_eye(n, n, A), A)
    return _lu_solve(lu, pivots, identity, n, True, adjoint=True), info


@_linalg_op("aten::linalg_cholesky_ex")
def linalg_cholesky_ex(self: TFloat, upper: bool = False, check_errors: bool = False) -> tuple[TFloat, INT32]:
    return _cholesky(self, upper, "linalg_cholesky")


@_linalg_op("aten::cholesky")
def cholesky(self: TFloat, upper: bool = False) -> TFloat:
    factor, _ = _cholesky(self, upper, "cholesky")
    return factor


def _cholesky_solve(b: Any, factor: Any, upper: bool, operator: str) -> Any:
    n = _static_size(factor, -1, operator)
    lower = _mT(factor) if upper else factor
    y = _solve_triangular_left(lower, b, n, lower=True, unit=False)
    return _solve_triangular_left(_mT(lower), y, n, lower=False, unit=False)


@_linalg_op("aten::cholesky_inverse")
def cholesky_inverse(self: TFloat, upper: bool = False) -> TFloat:
    n = _static_size(self, -1, "cholesky_inverse")
    return _cholesky_solve(_expand_matrix(_eye(n, n, self), self), self, upper, "cholesky_inverse")


@_linalg_op("aten::cholesky_solve", "aten::_cholesky_solve_helper")
def cholesky_solve(self: TFloat, input2: TFloat, upper: bool = False) -> TFloat:
    return _cholesky_solve(self, input2, upper, "cholesky_solve")


@_linalg_op("aten::linalg_solve_triangular")
def linalg_solve_triangular(
    self: TFloat, B: TFloat, upper: bool, left: bool = True, unitriangular: bool = False
) -> TFloat:
    n = _static_size(self, -1, "linalg_solve_triangular")
    return _solve_triangular(self, B, n, upper, left, unitriangular)


@_linalg_op("aten::triangular_solve")
def triangular_solve(
    self: TFloat, A: TFloat, upper: bool = True, transpose: bool = False, unitriangular: bool = False
) -> tuple[TFloat, TFloat]:
    n = _static_size(A, -1, "triangular_solve")
    coefficients = _mT(A) if transpose else A
    lower = (not upper) != transpose
    solution = _solve_triangular_left(coefficients, self, n, lower=lower, unit=unitriangular)
    return solution, op.Identity(A)


def _unpack_lu(lu: Any, pivots: Any, m: int, n: int, unpack_data: bool, unpack_pivots: bool) -> tuple[Any, Any, Any]:
    """P, L, U of a packed LU (..., m, n): P (m, m), L (m, k) unit lower, U (k, n) upper."""
    k = min(m, n)
    rows_m = np.arange(m, dtype=np.int64)
    empty = np.zeros((0,), dtype=_np_dtype(lu))
    if unpack_pivots:
        order = _row_order(pivots, m, min(k, _static_size(pivots, -1, "lu_unpack")))
        # A = P L U: row i of L U is row order[i] of A, so P[order[i], i] = 1.
        permutation = op.CastLike(op.Equal(op.Unsqueeze(order, _index(-2)), rows_m[:, None]), lu)
        permutation = op.Expand(permutation, op.Concat(_batch_shape(lu), _index(m, m), axis=0))
    else:
        permutation = op.Identity(empty)
    if not unpack_data:
        return permutation, op.Identity(empty), op.Identity(empty)
    cols_k = np.arange(k, dtype=np.int64)
    left = op.Slice(lu, _index(0), _index(k), _index(-1))  # (..., m, k)
    lower = op.Where(rows_m[:, None] > cols_k[None, :], left, _eye(m, k, lu))
    top = op.Slice(lu, _index(0), _index(k), _index(-2))  # (..., k, n)
    upper = op.Where(cols_k[:, None] <= np.arange(n, dtype=np.int64)[None, :], top, _scalar(0.0, lu))
    return permutation, lower, upper


@_linalg_op("aten::lu_unpack")
def lu_unpack(
    LU_data: TFloat, LU_pivots: INT32, unpack_data: bool = True, unpack_pivots: bool = True
) -> tuple[TFloat, TFloat, TFloat]:
    m = _static_size(LU_data, -2, "lu_unpack")
    n = _static_size(LU_data, -1, "lu_unpack")
    return _unpack_lu(LU_data, LU_pivots, m, n, unpack_data, unpack_pivots)


@_linalg_op("aten::linalg_lu")
def linalg_lu(A: TFloat, pivot: bool = True) -> tuple[TFloat, TFloat, TFloat]:
    m = _static_size(A, -2, "linalg_lu")
    n = _static_size(A, -1, "linalg_lu")
    lu, pivots, _ = _lu_factor(A, m, n, pivot)
    return _unpack_lu(lu, pivots, m, n, True, True)


@_linalg_op("aten::_linalg_slogdet")
def linalg_slogdet(A: TFloat) -> tuple[TFloat, TFloat, TFloat, INT32]:
    n = _static_size(A, -1, "linalg_slogdet")
    lu, pivots, _ = _lu_factor(_mT(A), n, n, True)
    batch = _batch_shape(A)
    if n == 0:
        return op.Expand(_scalar(1.0, A), batch), op.Expand(_scalar(0.0, A), batch), lu, pivots
    diagonal = op.Concat(*[op.Gather(_column(lu, j), _index(j), axis=-1) for j in range(n)], axis=-1)
    swaps = op.ReduceSum(
        op.Cast(op.Not(op.Equal(pivots, np.arange(1, n + 1, dtype=np.int32))), to=ir.DataType.INT64), _index(-1), keepdims=0
    )
    parity = op.Where(op.Equal(op.Mod(swaps, np.array(2, dtype=np.int64)), np.array(1, dtype=np.int64)), _scalar(-1.0, A), _scalar(1.0, A))
    sign = op.Mul(parity, op.ReduceProd(op.Sign(diagonal), _index(-1), keepdims=0))
    log_abs = op.ReduceSum(op.Log(op.Abs(diagonal)), _index(-1), keepdims=0)
    return sign, log_abs, lu, pivots


@_linalg_op("aten::linalg_qr")
def linalg_qr(A: TFloat, mode: str = "reduced") -> tuple[TFloat, TFloat]:
    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"linalg_qr: mode must be 'reduced', 'complete' or 'r', got {mode!r}")
    m = _static_size(A, -2, "linalg_qr")
    n = _static_size(A, -1, "linalg_qr")
    k = min(m, n)
    r, q, _, _ = _householder_qr(A, m, n, want_q=mode != "r")
    if mode == "r":
        return op.Identity(np.zeros((0,), dtype=_np_dtype(A))), op.Slice(r, _index(0), _index(k), _index(-2))
    if mode == "complete":
        return q, r
    return op.Slice(q, _index(0), _index(k), _index(-1)), op.Slice(r, _index(0), _index(k), _index(-2))


@_linalg_op("aten::geqrf")
def geqrf(self: TFloat) -> tuple[TFloat, TFloat]:
    m = _static_size(self, -2, "geqrf")
    n = _static_size(self, -1, "geqrf")
    _, _, packed, tau = _householder_qr(self, m, n, want_q=False)
    return packed, tau


def _apply_reflections(reflectors: Any, tau: Any, q: Any, m: int, k: int, transpose: bool) -> Any:
    """H_0 H_1 ... H_{k-1} Q (or its transpose applied: H_{k-1} ... H_0 Q) where
    H_j = I - tau_j v_j v_j^T and v_j is column j of ``reflectors`` (..., m, >=k) below
    the diagonal with a 1 on it, as geqrf stores them."""
    rows = np.arange(m, dtype=np.int64)
    one, zero = _scalar(1.0, reflectors), _scalar(0.0, reflectors)
    steps = range(k) if transpose else range(k - 1, -1, -1)
    for j in steps:
        v = op.Where(rows > j, _column(reflectors, j), op.Where(rows == j, one, zero))
        t = op.Unsqueeze(op.Gather(tau, _index(j), axis=-1), _index(-1))  # (..., 1, 1)
        v_col = op.Unsqueeze(v, _index(-1))
        q = op.Sub(q, op.Mul(op.Mul(t, v_col), op.MatMul(op.Unsqueeze(v, _index(-2)), q)))
    return q


@_linalg_op("aten::linalg_householder_product")
def linalg_householder_product(input: TFloat, tau: TFloat) -> TFloat:
    m = _static_size(input, -2, "linalg_householder_product")
    n = _static_size(input, -1, "linalg_householder_product")
    k = _static_size(tau, -1, "linalg_householder_product")
    # The first n columns of H_0 ... H_{k-1}.
    return _apply_reflections(input, tau, _expand_matrix(_eye(m, n, input), input), m, k, transpose=False)


@_linalg_op("aten::ormqr")
def ormqr(self: TFloat, input2: TFloat, input3: TFloat, left: bool = True, transpose: bool = False) -> TFloat:
    """Q C, Q^T C, C Q or C Q^T with Q = H_0 ... H_{k-1} given by geqrf's reflections."""
    k = _static_size(input2, -1, "ormqr")
    if left:
        m = _static_size(input3, -2, "ormqr")
        return _apply_reflections(self, input2, input3, m, k, transpose)
    # C Q = (Q^T C^T)^T and C Q^T = (Q C^T)^T
    m = _static_size(input3, -1, "ormqr")
    return _mT(_apply_reflections(self, input2, _mT(input3), m, k, not transpose))
