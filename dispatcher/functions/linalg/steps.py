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

from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript import opset18 as op

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


def _padding(rank: int, axis: int, after: int) -> np.ndarray:
    pads = [0] * (2 * rank)
    pads[rank + (axis % rank)] = after
    return np.array(pads, dtype=np.int64)


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
