"""Symmetric eigendecomposition, SVD and pseudo-inverse by parallel Jacobi rotations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional
import numpy as np
from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.tensor_typing import TFloat
from dispatcher.functions.linalg.steps import MAX_EIGH_SIZE, _check_jacobi_size, _expand_matrix, _eye, _index, _linalg_op, _mT, _np_dtype, _scalar, _static_size

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
