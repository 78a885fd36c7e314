"""Linear algebra ONNX has no operator for: LU, solve, inverse, Cholesky, triangular solves, QR.

ONNX has no factorization operator, so each function writes the textbook algorithm out
step by step at trace time: the matrix size must be static (it is unless the matrix dims
are exported as dynamic; batch dims may be dynamic) and at most
:data:`MAX_UNROLLED_SIZE`, otherwise the function raises an error saying so. Each step is
a few batched ONNX ops on the whole matrix with constant masks (``Where``), so leading
batch dims of any rank broadcast as in PyTorch, and 0x0 matrices or empty batches give
empty results.

The algorithms follow LAPACK's, which PyTorch calls on the CPU, so that results that are
not unique come out the same:

* LU with partial pivoting (``getrf``): the pivot is the first row of largest absolute
  value; a zero pivot leaves its column unscaled; pivots are 1-based int32 row swaps and
  ``info`` is the 1-based index of the first zero diagonal element of U (0 when none).
* Cholesky (``potrf``) reads only the triangle it is asked for; ``info`` is the 1-based
  order of the first leading minor that is not positive definite.
* QR by Householder reflections as ``geqrf`` chooses them (R's diagonal has the sign
  opposite to the pivot column's, a column already zero below the diagonal is left as
  it is), Q accumulated from the same reflections.
* eigh and SVD by parallel Jacobi rotations: eigenvalues and singular values as LAPACK
  gives them (sorted), vectors defined up to sign (each V column with its largest
  component positive).

``check_errors=True`` cannot raise inside an ONNX graph: ``info`` is computed either way.
Real floating inputs only (complex inputs keep torchlib's behaviour: no function).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import onnx_ir as ir
from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.tensor_typing import INT32, TFloat

from dispatcher.function_table import FunctionTable

__all__ = ["LINALG_DOMAIN", "LINALG_FUNCTIONS", "MAX_EIGH_SIZE", "MAX_UNROLLED_SIZE"]

LINALG_DOMAIN = "pkg.fx2onnx.linalg"
_TABLE = FunctionTable(LINALG_DOMAIN)

LINALG_FUNCTIONS = _TABLE.entries

# Every step of a factorization is written out: the graph grows with n (LU: ~15 nodes
# per column), so larger matrices are refused rather than exported into a huge graph.
MAX_UNROLLED_SIZE = 128
# Jacobi's eigenvalue method rotates every pair of rows in each sweep: ~20 n^2 nodes per sweep.
MAX_EIGH_SIZE = 16


_linalg_op = _TABLE.op


# -- sizes and constants ------------------------------------------------------------------


def _static_size(value: Any, axis: int, operator: str, limit: int = MAX_UNROLLED_SIZE) -> int:
    """The size of ``value`` along ``axis``, which must be a static int to unroll over it."""
    shape = value.shape
    dim = None if shape is None or len(shape) < -axis else shape[axis]
    if not isinstance(dim, int):
        raise ValueError(
            f"{operator}: fx2onnx writes this factorization out step by step, which needs "
            f"the matrix size to be static, but dim {axis} of the input is {dim!r}. Export "
            "with a static size for the matrix dims (batch dims may stay dynamic)."
        )
    if dim > limit:
        raise ValueError(
            f"{operator}: the matrix size {dim} is larger than {limit}, the "
            "largest size fx2onnx writes out step by step (the graph grows with it). "
            "Compute this factorization outside the exported model for such sizes."
        )
    return dim


def _check_jacobi_size(k: int, operator: str) -> None:
    """Jacobi methods rotate every pair of the k columns in each sweep: k is limited more."""
    if k > MAX_EIGH_SIZE:
        raise ValueError(
            f"{operator}: the matrix size {k} is larger than {MAX_EIGH_SIZE}, the largest "
            "size fx2onnx writes Jacobi rotations out for (the graph grows with its square). "
            "Compute this decomposition outside the exported model for such sizes."
        )


def _rank(value: Any) -> int:
    return len(value.shape)


def _np_dtype(value: Any) -> Any:
    return value.dtype.numpy()


def _scalar(number: float, like: Any) -> np.ndarray:
    return np.array(number, dtype=_np_dtype(like))


def _index(*positions: int) -> np.ndarray:
    return np.array(list(positions), dtype=np.int64)


def _mT(x: Any) -> Any:
    """Swap the last two dims."""
    rank = _rank(x)
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    return op.Transpose(x, perm=perm)


def _batch_shape(x: Any) -> Any:
    return op.Shape(x, end=-2)


def _column(x: Any, j: int) -> Any:
    """x[..., :, j]."""
    return op.Gather(x, np.array(j, dtype=np.int64), axis=-1)


def _row(x: Any, j: int) -> Any:
    """x[..., j, :]."""
    return op.Gather(x, np.array(j, dtype=np.int64), axis=-2)


def _entry(x: Any, i: int, j: int) -> Any:
    """x[..., i:i+1, j:j+1]."""
    return op.Slice(x, _index(i, j), _index(i + 1, j + 1), _index(-2, -1))


def _eye(rows: int, cols: int, like: Any) -> np.ndarray:
    return np.eye(rows, cols, dtype=_np_dtype(like))


def _expand_matrix(matrix: np.ndarray, batch_of: Any) -> Any:
    """The constant matrix repeated over the batch dims of ``batch_of``."""
    shape = op.Concat(_batch_shape(batch_of), _index(*matrix.shape), axis=0)
    return op.Expand(matrix, shape)


def _first_true_plus_one(flags: Any) -> Any:
    """Along the last axis: 1 + the index of the first true flag, 0 when none (int32)."""
    as_float = op.Cast(flags, to=ir.DataType.FLOAT)
    first = op.ArgMax(as_float, axis=-1, keepdims=0)
    found = op.Greater(op.ReduceMax(as_float, _index(-1), keepdims=0), np.array(0.0, dtype=np.float32))
    return op.Cast(op.Where(found, op.Add(first, np.array(1, dtype=np.int64)), np.array(0, dtype=np.int64)), to=ir.DataType.INT32)


def _zeros_int32(shape: Any) -> Any:
    return op.Expand(np.array(0, dtype=np.int32), shape)


# -- LU factorization ---------------------------------------------------------------------


def _lu_factor(a: Any, m: int, n: int, pivot: bool) -> tuple[Any, Any, Any]:
    """LU of ``a`` (..., m, n) in LAPACK's packed form: (LU, pivots int32, info int32)."""
    k = min(m, n)
    rows = np.arange(m, dtype=np.int64)
    cols = np.arange(n, dtype=np.int64)
    zero, one = _scalar(0.0, a), _scalar(1.0, a)
    pivot_rows = []
    diagonal = []
    for j in range(k):
        if pivot:
            # The first row at or below j whose |value| in column j is the largest.
            key = op.Where(rows >= j, op.Abs(_column(a, j)), _scalar(-1.0, a))
            chosen = op.ArgMax(key, axis=-1, keepdims=1)  # (..., 1)
            is_chosen = op.Unsqueeze(op.Equal(rows, chosen), _index(-1))  # (..., m, 1)
            chosen_row = op.ReduceSum(op.Where(is_chosen, a, zero), _index(-2), keepdims=1)
            row_j = op.Slice(a, _index(j), _index(j + 1), _index(-2))
            a = op.Where((rows == j)[:, None], chosen_row, op.Where(is_chosen, row_j, a))
            pivot_rows.append(chosen)
        column = _column(a, j)  # (..., m)
        pivot_value = op.Gather(column, _index(j), axis=-1)  # (..., 1)
        diagonal.append(pivot_value)
        # A zero pivot (its column is zero below it) leaves the column as it is.
        safe_pivot = op.Where(op.Equal(pivot_value, zero), one, pivot_value)
        multipliers = op.Where(rows > j, op.Mul(column, op.Reciprocal(safe_pivot)), zero)
        right_of_pivot = op.Where(cols > j, _row(a, j), zero)
        multipliers = op.Unsqueeze(multipliers, _index(-1))  # (..., m, 1)
        a = op.Sub(a, op.Mul(multipliers, op.Unsqueeze(right_of_pivot, _index(-2))))
        below_pivot = (rows > j)[:, None] & (cols == j)[None, :]
        a = op.Where(below_pivot, multipliers, a)

    batch = _batch_shape(a)
    pivots_shape = op.Concat(batch, _index(k), axis=0)
    if pivot and k > 0:
        pivots = op.Cast(op.Add(op.Concat(*pivot_rows, axis=-1), np.array(1, dtype=np.int64)), to=ir.DataType.INT32)
        pivots = op.Expand(pivots, pivots_shape)
    else:
        pivots = op.Expand(np.arange(1, k + 1, dtype=np.int32), pivots_shape)
    if k == 0:
        info = _zeros_int32(batch)
    else:
        info = _first_true_plus_one(op.Equal(op.Concat(*diagonal, axis=-1), zero))
    return a, pivots, info


def _row_order(pivots: Any, n: int, k: int) -> Any:
    """From LAPACK row swaps (1-based, applied in order): order[i] is the original row
    that ends in row i (int64, (..., n))."""
    order = np.arange(n, dtype=np.int64)
    rows = np.arange(n, dtype=np.int64)
    pivots = op.Sub(op.Cast(pivots, to=ir.DataType.INT64), np.array(1, dtype=np.int64))
    for j in range(k):
        swapped_with = op.Gather(pivots, _index(j), axis=-1)  # (..., 1)
        is_other = op.Equal(rows, swapped_with)
        at_other = op.ReduceSum(op.Where(is_other, order, np.array(0, dtype=np.int64)), _index(-1), keepdims=1)
        at_j = op.Gather(order, _index(j), axis=-1)
        order = op.Where(rows == j, at_other, op.Where(is_other, at_j, order))
    return order


def _permutation_mask(order: Any, n: int) -> Any:
    """mask[..., i, r] is true where row r of the original goes to row i."""
    return op.Equal(op.Unsqueeze(order, _index(-1)), np.arange(n, dtype=np.int64))


def _gather_rows(mask: Any, b: Any) -> Any:
    """out[..., i, :] = b[..., r, :] where mask[..., i, r]: exact, broadcasting batch dims."""
    selected = op.Where(op.Unsqueeze(mask, _index(-1)), op.Unsqueeze(b, _index(-3)), _scalar(0.0, b))
    return op.ReduceSum(selected, _index(-2), keepdims=0)


# -- triangular solves --------------------------------------------------------------------


def _solve_triangular_left(t: Any, b: Any, n: int, lower: bool, unit: bool) -> Any:
    """X with T X = B, reading only T's lower (or upper) triangle; unit: diagonal of ones."""
    rows = np.arange(n, dtype=np.int64)
    steps = range(n) if lower else range(n - 1, -1, -1)
    for j in steps:
        row_j = op.Slice(b, _index(j), _index(j + 1), _index(-2))  # (..., 1, k)
        if not unit:
            row_j = op.Div(row_j, _entry(t, j, j))
            b = op.Where((rows == j)[:, None], row_j, b)
        remaining = rows > j if lower else rows < j
        column = op.Unsqueeze(op.Where(remaining, _column(t, j), _scalar(0.0, t)), _index(-1))
        b = op.Sub(b, op.Mul(column, row_j))
    return b


def _solve_triangular(t: Any, b: Any, n: int, upper: bool, left: bool, unit: bool) -> Any:
    if left:
        return _solve_triangular_left(t, b, n, lower=not upper, unit=unit)
    # X T = B  <=>  T^T X^T = B^T, and T^T has the other triangle.
    return _mT(_solve_triangular_left(_mT(t), _mT(b), n, lower=upper, unit=unit))


def _lu_solve(lu: Any, pivots: Any, b: Any, n: int, left: bool, adjoint: bool) -> Any:
    """X with A X = B (or A^T X = B, X A = B, X A^T = B) where P L U = A is given packed."""
    if not left:
        # X A = B <=> A^T X^T = B^T and X A^T = B <=> A X^T = B^T (real matrices).
        return _mT(_lu_solve(lu, pivots, _mT(b), n, left=True, adjoint=not adjoint))
    mask = _permutation_mask(_row_order(pivots, n, n), n)
    if not adjoint:
        x = _gather_rows(mask, b)  # P^T B
        x = _solve_triangular_left(lu, x, n, lower=True, unit=True)
        return _solve_triangular_left(lu, x, n, lower=False, unit=False)
    # A^T = U^T L^T P^T: solve with U^T, then L^T, then apply P.
    lu_t = _mT(lu)
    x = _solve_triangular_left(lu_t, b, n, lower=True, unit=False)
    x = _solve_triangular_left(lu_t, x, n, lower=False, unit=True)
    return _gather_rows(_mT(mask), x)


# -- Cholesky -----------------------------------------------------------------------------


def _cholesky_lower(a: Any, n: int) -> tuple[Any, Any]:
    """L with L L^T = A from A's lower triangle, and potrf's info (int32, batch shape)."""
    rows = np.arange(n, dtype=np.int64)
    zero = _scalar(0.0, a)
    columns = []
    pivots = []
    for j in range(n):
        pivot = op.Gather(_column(a, j), _index(j), axis=-1)  # (..., 1)
        pivots.append(pivot)
        root = op.Sqrt(pivot)
        column = op.Where(rows > j, op.Div(_column(a, j), root), op.Where(rows == j, root, zero))
        columns.append(op.Unsqueeze(column, _index(-1)))
        below = op.Where(rows > j, column, zero)
        a = op.Sub(a, op.Mul(op.Unsqueeze(below, _index(-1)), op.Unsqueeze(below, _index(-2))))
    if n == 0:
        return a, _zeros_int32(_batch_shape(a))
    lower = op.Concat(*columns, axis=-1)
    # potrf stops at the first pivot that is not > 0 (NaN included).
    info = _first_true_plus_one(op.Not(op.Greater(op.Concat(*pivots, axis=-1), zero)))
    return lower, info


def _cholesky(a: Any, upper: bool, operator: str) -> tuple[Any, Any]:
    n = _static_size(a, -1, operator)
    if upper:
        # U^T U = A from A's upper triangle, which is the lower triangle of A^T.
        lower, info = _cholesky_lower(_mT(a), n)
        return _mT(lower), info
    return _cholesky_lower(a, n)


# -- QR -----------------------------------------------------------------------------------


def _householder_qr(a: Any, m: int, n: int, want_q: bool) -> tuple[Any, Any, Any, Any]:
    """geqrf's reflections applied to A: (R full (m, n), Q (m, m) or None, V packed below
    R's diagonal as geqrf stores it, tau (..., k))."""
    k = min(m, n)
    rows = np.arange(m, dtype=np.int64)
    cols = np.arange(n, dtype=np.int64)
    zero, one = _scalar(0.0, a), _scalar(1.0, a)
    q = _expand_matrix(_eye(m, m, a), a) if want_q else None
    r = a
    reflectors = []
    taus = []
    for j in range(k):
        column = _column(r, j)  # (..., m)
        alpha = op.Gather(column, _index(j), axis=-1)  # (..., 1)
        below = op.Where(rows > j, column, zero)
        below_sq = op.ReduceSumSquare(below, _index(-1), keepdims=1)
        untouched = op.Equal(below_sq, zero)
        norm = op.Sqrt(op.Add(op.Mul(alpha, alpha), below_sq))
        beta = op.Where(untouched, alpha, op.Where(op.Less(alpha, zero), norm, op.Neg(norm)))
        tau = op.Where(untouched, zero, op.Div(op.Sub(beta, alpha), op.Where(untouched, one, beta)))
        scale = op.Reciprocal(op.Where(untouched, one, op.Sub(alpha, beta)))
        v = op.Where(rows > j, op.Mul(column, scale), op.Where(rows == j, one, zero))  # (..., m)
        reflectors.append(op.Unsqueeze(v, _index(-1)))
        taus.append(tau)
        v_col = op.Unsqueeze(v, _index(-1))  # (..., m, 1)
        v_row = op.Unsqueeze(v, _index(-2))  # (..., 1, m)
        tau_ = op.Unsqueeze(tau, _index(-1))  # (..., 1, 1)
        # R <- (I - tau v v^T) R on the columns right of j; column j becomes (beta, 0...).
        update = op.Mul(op.Mul(tau_, v_col), op.MatMul(v_row, r))
        r = op.Where(cols > j, op.Sub(r, update), r)
        r = op.Where((rows == j)[:, None] & (cols == j)[None, :], op.Unsqueeze(beta, _index(-1)), r)
        r = op.Where((rows > j)[:, None] & (cols == j)[None, :], zero, r)
        if want_q:
            # Q <- Q (I - tau v v^T)
            q = op.Sub(q, op.Mul(op.Mul(op.MatMul(q, v_col), tau_), v_row))
    if k > 0:
        tau = op.Concat(*taus, axis=-1)
        below_diagonal = (rows[:, None] > cols[None, :])
        v_all = op.Concat(*reflectors, axis=-1)  # (..., m, k)
        if k < n:
            v_all = op.Pad(v_all, _padding(_rank(a), -1, n - k))
        packed = op.Where(below_diagonal, v_all, r)
    else:
        tau = op.Expand(np.zeros((0,), dtype=_np_dtype(a)), op.Concat(_batch_shape(a), _index(0), axis=0))
        packed = r
    return r, q, packed, tau


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


def _padding(rank: int, axis: int, after: int) -> np.ndarray:
    pads = [0] * (2 * rank)
    pads[rank + (axis % rank)] = after
    return np.array(pads, dtype=np.int64)


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


# -- symmetric eigendecomposition -----------------------------------------------------------


def _jacobi_sweeps(n: int, like: Any) -> int:
    """Cyclic Jacobi converges quadratically once rotations are small: a few sweeps more
    than log2(n) bring the off-diagonal below float32 (float64) rounding."""
    extra = 6 if like.dtype.itemsize >= 8 else 4
    return max(1, int(np.ceil(np.log2(max(n, 2)))) + extra)


def _round_robin(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs (p < q) meeting every pair of 0..n-1 once (circle method;
    for odd n one index sits out each round)."""
    players = list(range(n + n % 2))
    rounds = []
    for _ in range(len(players) - 1):
        half = len(players) // 2
        pairs = [(min(a, b), max(a, b)) for a, b in zip(players[:half], reversed(players[half:]))]
        rounds.append([pair for pair in pairs if pair[1] < n])
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def _jacobi_rotation(gram: Any, pairs: Sequence[tuple[int, int]], n: int) -> Any:
    """The rotation (..., n, n) that zeroes gram[p, q] for each disjoint pair (p, q) of the
    symmetric ``gram``: rotation[p, p] = rotation[q, q] = c, rotation[p, q] = s,
    rotation[q, p] = -s, tan of the angle being the smaller root as in the classical method."""
    dtype = _np_dtype(gram)
    zero, one = _scalar(0.0, gram), _scalar(1.0, gram)
    identity = np.eye(n, dtype=dtype)
    p = np.array([pair[0] for pair in pairs], dtype=np.int64)
    q = np.array([pair[1] for pair in pairs], dtype=np.int64)
    one_hot_q = identity[q]  # (k, n)
    selected = identity[p] + one_hot_q  # (k, n): rows p_i and q_i
    signs = np.zeros((n, n), dtype=dtype)
    signs[p, q], signs[q, p] = 1.0, -1.0
    left_out = (1.0 - selected.sum(axis=0)).astype(dtype)  # indices no pair rotates
    diagonal = op.ReduceSum(op.Mul(gram, identity), _index(-1), keepdims=0)
    g_pp = op.Gather(diagonal, p, axis=-1)
    g_qq = op.Gather(diagonal, q, axis=-1)
    g_pq = op.ReduceSum(op.Mul(op.Gather(gram, p, axis=-2), one_hot_q), _index(-1), keepdims=0)
    done = op.Equal(g_pq, zero)
    theta = op.Div(op.Sub(g_qq, g_pp), op.Mul(_scalar(2.0, gram), op.Where(done, one, g_pq)))
    sign = op.Where(op.Less(theta, zero), _scalar(-1.0, gram), one)
    t = op.Div(sign, op.Add(op.Abs(theta), op.Sqrt(op.Add(op.Mul(theta, theta), one))))
    t = op.Where(done, zero, t)
    c = op.Reciprocal(op.Sqrt(op.Add(op.Mul(t, t), one)))
    s = op.Mul(t, c)
    c_full = op.Add(op.MatMul(c, selected), left_out)
    s_full = op.MatMul(s, selected)
    return op.Add(op.Mul(op.Unsqueeze(c_full, _index(-1)), identity), op.Mul(op.Unsqueeze(s_full, _index(-1)), signs))


def _jacobi_eigh(a: Any, n: int, want_vectors: bool) -> tuple[Any, Any]:
    """Eigenvalues (unsorted diagonal) and eigenvectors (columns) of symmetric ``a`` by
    parallel cyclic Jacobi: each round rotates disjoint pairs (p, q) at once."""
    identity = _eye(n, n, a)
    vectors = _expand_matrix(identity, a) if want_vectors else None
    rounds = [pairs for pairs in _round_robin(n) if pairs]
    for _ in range(_jacobi_sweeps(n, a)):
        for pairs in rounds:
            rotation = _jacobi_rotation(a, pairs, n)
            a = op.MatMul(op.MatMul(_mT(rotation), a), rotation)
            if want_vectors:
                vectors = op.MatMul(vectors, rotation)
    values = op.ReduceSum(op.Mul(a, identity), _index(-1), keepdims=0)
    return values, vectors


def _jacobi_svd(a: Any, n: int, want_vectors: bool) -> tuple[Any, Any, Any]:
    """One-sided (Hestenes) Jacobi on the columns of ``a`` (..., m, n), m >= n: rotations
    orthogonalize the columns; singular values are their norms (unsorted), U the
    normalized columns, V the accumulated rotations."""
    vectors = _expand_matrix(_eye(n, n, a), a) if want_vectors else None
    rounds = [pairs for pairs in _round_robin(n) if pairs]
    for _ in range(_jacobi_sweeps(n, a)):
        for pairs in rounds:
            rotation = _jacobi_rotation(op.MatMul(_mT(a), a), pairs, n)
            a = op.MatMul(a, rotation)
            if want_vectors:
                vectors = op.MatMul(vectors, rotation)
    values = op.Sqrt(op.ReduceSumSquare(a, _index(-2), keepdims=0))
    return values, a, vectors


@_linalg_op("aten::_linalg_eigh")
def linalg_eigh(A: TFloat, UPLO: str = "L", compute_v: bool = True) -> tuple[TFloat, TFloat]:
    """Eigenvalues ascending as PyTorch gives them. Eigenvectors are defined up to sign:
    each is returned with its largest-magnitude component positive, where LAPACK's
    sign follows from its algorithm (compare ``V diag(w) V^T`` rather than ``V``)."""
    if UPLO not in ("L", "U"):
        raise ValueError(f"linalg_eigh: UPLO must be 'L' or 'U', got {UPLO!r}")
    n = _static_size(A, -1, "linalg_eigh", limit=MAX_EIGH_SIZE)
    if n == 0:
        values = op.ReduceSum(A, _index(-1), keepdims=0)
        return values, (A if compute_v else op.Identity(np.zeros((0,), dtype=_np_dtype(A))))
    rows = np.arange(n, dtype=np.int64)
    kept = rows[:, None] >= rows[None, :] if UPLO == "L" else rows[:, None] <= rows[None, :]
    symmetric = op.Where(kept, A, _mT(A))
    values, vectors = _jacobi_eigh(symmetric, n, compute_v)
    values, order = op.TopK(values, _index(n), axis=-1, largest=0, sorted=1)
    if not compute_v:
        return values, op.Identity(np.zeros((0,), dtype=_np_dtype(A)))
    order = op.Expand(op.Unsqueeze(order, _index(-2)), op.Shape(vectors))
    vectors = op.GatherElements(vectors, order, axis=-1)
    largest = op.ArgMax(op.Abs(vectors), axis=-2, keepdims=1)
    sign = op.Sign(op.GatherElements(vectors, largest, axis=-2))
    vectors = op.Mul(vectors, op.Where(op.Equal(sign, _scalar(0.0, A)), _scalar(1.0, A), sign))
    return values, vectors


@_linalg_op("aten::_linalg_svd")
def linalg_svd(
    A: TFloat, full_matrices: bool = False, compute_uv: bool = True, driver: Any = None
) -> tuple[TFloat, TFloat, TFloat]:
    """Singular values descending as PyTorch gives them; U's and V's columns are defined up
    to sign (each V column has its largest component positive)."""
    m = _static_size(A, -2, "linalg_svd")
    n = _static_size(A, -1, "linalg_svd")
    k = min(m, n)
    _check_jacobi_size(k, "linalg_svd")
    if compute_uv and full_matrices and m != n:
        raise ValueError(
            "linalg_svd: full_matrices=True on a non-square matrix needs a completed basis that "
            "fx2onnx does not compute; use full_matrices=False (or torch.linalg.svdvals)."
        )
    empty = np.zeros((0,), dtype=_np_dtype(A))
    wide = m < n
    columns = _mT(A) if wide else A  # (..., max, min): k columns to orthogonalize
    if k == 0:
        values = op.ReduceSum(op.Slice(columns, _index(0), _index(0), _index(-2)), _index(-2), keepdims=0)
        if not compute_uv:
            return op.Identity(empty), values, op.Identity(empty)
        u = op.Slice(A, _index(0), _index(k), _index(-1))
        vh = op.Slice(A, _index(0), _index(k), _index(-2))
        return u, values, vh
    values, rotated, v = _jacobi_svd(columns, k, compute_uv)
    values, order = op.TopK(values, _index(k), axis=-1, largest=1, sorted=1)
    if not compute_uv:
        return op.Identity(empty), values, op.Identity(empty)
    order = op.Unsqueeze(order, _index(-2))
    rotated = op.GatherElements(rotated, op.Expand(order, op.Shape(rotated)), axis=-1)
    v = op.GatherElements(v, op.Expand(order, op.Shape(v)), axis=-1)
    largest = op.ArgMax(op.Abs(v), axis=-2, keepdims=1)
    sign = op.Sign(op.GatherElements(v, largest, axis=-2))
    sign = op.Where(op.Equal(sign, _scalar(0.0, A)), _scalar(1.0, A), sign)
    v = op.Mul(v, sign)
    # A zero singular value leaves its column of U as zeros (PyTorch gives some unit vector).
    safe = op.Where(op.Equal(values, _scalar(0.0, A)), _scalar(1.0, A), values)
    u = op.Div(op.Mul(rotated, sign), op.Unsqueeze(safe, _index(-2)))
    if wide:  # A^T = U' S V'^T  =>  A = V' S U'^T
        return v, values, _mT(u)
    return u, values, _mT(v)


def _pinv(a: Any, atol: Any, rtol: Any, hermitian: bool) -> Any:
    """PyTorch's pseudo-inverse: singular values (|eigenvalues| when hermitian) above
    max(atol, rtol * largest) are inverted, the others dropped. rtol defaults to
    eps * max(m, n), or to 0 where a positive atol is given."""
    m = _static_size(a, -2, "linalg_pinv")
    n = _static_size(a, -1, "linalg_pinv")
    _check_jacobi_size(min(m, n), "linalg_pinv")
    if min(m, n) == 0:
        return _mT(a)
    zero = _scalar(0.0, a)
    default_rtol = _scalar(float(np.finfo(_np_dtype(a)).eps) * max(m, n), a)
    atol_given = atol is not None
    atol = zero if atol is None else (_scalar(atol, a) if isinstance(atol, float) else op.CastLike(atol, a))
    if rtol is None:
        rtol = op.Where(op.Greater(atol, zero), zero, default_rtol) if atol_given else default_rtol
    else:
        rtol = _scalar(rtol, a) if isinstance(rtol, float) else op.CastLike(rtol, a)
    if hermitian:
        values, vectors = linalg_eigh(a, "L", True)
        magnitude = op.Abs(values)
        left, right = vectors, _mT(vectors)
    else:
        left, values, right = linalg_svd(a, False, True, None)
        magnitude = values
        left, right = _mT(right), _mT(left)  # V and U^T: pinv = V diag(1/s) U^T
    largest = op.ReduceMax(magnitude, _index(-1), keepdims=1)
    tolerance = op.Max(op.Unsqueeze(atol, _index(-1)), op.Mul(op.Unsqueeze(rtol, _index(-1)), largest))
    safe = op.Where(op.Equal(values, zero), _scalar(1.0, a), values)
    inverted = op.Where(op.Greater(magnitude, tolerance), op.Reciprocal(safe), zero)
    return op.MatMul(op.Mul(left, op.Unsqueeze(inverted, _index(-2))), right)


@_linalg_op("aten::linalg_pinv.atol_rtol_tensor")
def linalg_pinv_tensor(
    self: TFloat, atol: Optional[TFloat] = None, rtol: Optional[TFloat] = None, hermitian: bool = False
) -> TFloat:
    return _pinv(self, atol, rtol, hermitian)


@_linalg_op("aten::linalg_pinv.atol_rtol_float")
def linalg_pinv_float(
    self: TFloat, atol: Optional[float] = None, rtol: Optional[float] = None, hermitian: bool = False
) -> TFloat:
    return _pinv(self, atol, rtol, hermitian)
