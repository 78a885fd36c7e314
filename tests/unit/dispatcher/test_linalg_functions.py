"""Linear algebra functions (LU, solve, inverse, Cholesky, triangular solves, QR) match PyTorch."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import fx2onnx
from conftest import Apply, export_program, make_options
from dispatcher.functions.linalg import steps as linalg_functions


def _matrices(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _spd(*batch: int, n: int = 4) -> torch.Tensor:
    a = torch.randn(*batch, n, n)
    return a @ a.mT + n * torch.eye(n)


def _lu(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.linalg.lu_factor(a)


CASES: dict[str, tuple[Callable[..., object], Callable[[], tuple[torch.Tensor, ...]]]] = {
    "inv_batched": (torch.linalg.inv_ex, lambda: (_matrices(2, 3, 4, 4),)),
    "inv_empty": (torch.linalg.inv, lambda: (_matrices(0, 0),)),
    "inv_empty_batch": (torch.linalg.inv, lambda: (_matrices(0, 3, 3),)),
    "tensorinv": (lambda a: torch.linalg.tensorinv(a, ind=2), lambda: (_matrices(2, 3, 6),)),
    "solve_matrix": (torch.linalg.solve_ex, lambda: (_matrices(2, 5, 5), _matrices(2, 5, 3))),
    "solve_vector": (torch.linalg.solve, lambda: (_matrices(5, 5), _matrices(5))),
    "solve_batched_vector": (torch.linalg.solve, lambda: (_matrices(3, 4, 4), _matrices(3, 4))),
    "solve_broadcast": (torch.linalg.solve, lambda: (_matrices(4, 4), _matrices(2, 4, 2))),
    "solve_right": (lambda a, b: torch.linalg.solve(a, b, left=False), lambda: (_matrices(2, 4, 4), _matrices(2, 3, 4))),
    "lu_factor_wide": (torch.linalg.lu_factor_ex, lambda: (_matrices(2, 3, 5),)),
    "lu_factor_tall": (torch.linalg.lu_factor_ex, lambda: (_matrices(5, 3),)),
    "lu_factor_singular": (torch.linalg.lu_factor_ex, lambda: (torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 0.0, 1.0]]),)),
    "lu_factor_ties": (torch.linalg.lu_factor_ex, lambda: (torch.tensor([[1.0, 2.0], [-1.0, 3.0]]),)),
    "lu_legacy": (lambda a: torch.lu(a, get_infos=True), lambda: (_matrices(4, 4),)),
    "linalg_lu": (torch.linalg.lu, lambda: (_matrices(2, 4, 6),)),
    "lu_unpack": (lambda lu, p: torch.lu_unpack(lu, p), lambda: _lu(_matrices(5, 5))),
    "lu_solve": (torch.linalg.lu_solve, lambda: (*_lu(_matrices(2, 4, 4)), _matrices(2, 4, 3))),
    "lu_solve_adjoint": (lambda lu, p, b: torch.linalg.lu_solve(lu, p, b, adjoint=True), lambda: (*_lu(_matrices(4, 4)), _matrices(4, 2))),
    "lu_solve_right_adjoint": (
        lambda lu, p, b: torch.linalg.lu_solve(lu, p, b, left=False, adjoint=True),
        lambda: (*_lu(_matrices(3, 3)), _matrices(2, 3)),
    ),
    "lu_solve_legacy": (lambda b, lu, p: torch.lu_solve(b, lu, p), lambda: (_matrices(4, 2), *_lu(_matrices(4, 4)))),
    "cholesky_lower": (torch.linalg.cholesky_ex, lambda: (_spd(2),)),
    "cholesky_upper": (lambda a: torch.linalg.cholesky(a, upper=True), lambda: (_spd(),)),
    # L past the failing column is unspecified (LAPACK stops there): info is compared.
    "cholesky_not_positive_info": (
        lambda a: torch.linalg.cholesky_ex(a).info,
        lambda: (torch.stack([torch.tensor([[4.0, 2.0, 0.0], [2.0, -3.0, 1.0], [0.0, 1.0, 2.0]]), torch.eye(3)]),),
    ),
    "cholesky_inverse": (torch.cholesky_inverse, lambda: (torch.linalg.cholesky(_spd(2)),)),
    "cholesky_inverse_upper": (lambda u: torch.cholesky_inverse(u, upper=True), lambda: (torch.linalg.cholesky(_spd(), upper=True),)),
    "cholesky_solve": (torch.cholesky_solve, lambda: (_matrices(2, 4, 3), torch.linalg.cholesky(_spd(2)))),
    "solve_triangular_right": (
        lambda a, b: torch.linalg.solve_triangular(a, b, upper=True, left=False, unitriangular=True),
        lambda: (_matrices(4, 4), _matrices(2, 4)),
    ),
    "solve_triangular_lower": (
        lambda a, b: torch.linalg.solve_triangular(a, b, upper=False),
        lambda: (_matrices(3, 3) + 3 * torch.eye(3), _matrices(3, 5)),
    ),
    "triangular_solve_transpose": (
        lambda b, a: torch.triangular_solve(b, a, upper=False, transpose=True),
        lambda: (_matrices(3, 2), _matrices(3, 3) + 3 * torch.eye(3)),
    ),
    "slogdet": (torch.linalg.slogdet, lambda: (_matrices(3, 4, 4),)),
    "slogdet_singular": (torch.linalg.slogdet, lambda: (torch.tensor([[1.0, 2.0], [2.0, 4.0]]),)),
    "qr_reduced_tall": (torch.linalg.qr, lambda: (_matrices(2, 5, 3),)),
    "qr_complete_wide": (lambda a: torch.linalg.qr(a, mode="complete"), lambda: (_matrices(3, 5),)),
    "qr_r": (lambda a: torch.linalg.qr(a, mode="r")[1], lambda: (_matrices(4, 4),)),
    "qr_zero_column": (torch.linalg.qr, lambda: (torch.tensor([[-2.0, 1.0], [0.0, 3.0], [0.0, 1.0]]),)),
    "geqrf": (torch.geqrf, lambda: (_matrices(5, 3),)),
    "ormqr_left_transpose": (
        lambda a, tau, c: torch.ormqr(a, tau, c, left=True, transpose=True),
        lambda: (*torch.geqrf(_matrices(2, 5, 3)), _matrices(2, 5, 2)),
    ),
    "ormqr_right": (
        lambda a, tau, c: torch.ormqr(a, tau, c, left=False),
        lambda: (*torch.geqrf(_matrices(4, 4)), _matrices(3, 4)),
    ),
    "eigvalsh_upper": (lambda a: torch.linalg.eigvalsh(a, UPLO="U"), lambda: (_matrices(2, 3, 3),)),
    # Eigenvectors are defined up to sign: V diag(w) V^T and V^T V are compared.
    "eigh_reconstructs": (
        lambda a: (lambda w, v: (w, (v * w.unsqueeze(-2)) @ v.mT, v.mT @ v))(*torch.linalg.eigh(a)),
        lambda: (_matrices(4, 4),),
    ),
    "svdvals_tall_batched": (torch.linalg.svdvals, lambda: (_matrices(2, 5, 3),)),
    "matrix_rank_deficient": (torch.linalg.matrix_rank, lambda: (_matrices(4, 2) @ _matrices(2, 4),)),
    # Singular vectors are defined up to sign: U diag(S) Vh and S are compared.
    "svd_reconstructs_wide": (
        lambda a: (lambda u, s, vh: ((u * s.unsqueeze(-2)) @ vh, s))(*torch.linalg.svd(a, full_matrices=False)),
        lambda: (_matrices(3, 5),),
    ),
    "pinv_rank_deficient": (torch.linalg.pinv, lambda: (_matrices(4, 2) @ _matrices(2, 4),)),
    "pinv_hermitian": (lambda a: torch.linalg.pinv(a, hermitian=True), lambda: ((lambda x: x + x.mT)(_matrices(2, 4, 4)),)),
    "pinv_atol_tensor": (lambda a, t: torch.linalg.pinv(a, atol=t), lambda: (_matrices(2, 4, 3), torch.tensor([0.5, 0.1]))),
    "pinv_tall_few_columns": (torch.linalg.pinv, lambda: (_matrices(40, 2),)),  # Jacobi runs over 2 columns
    "pinverse_rcond": (lambda a: torch.pinverse(a, rcond=0.1), lambda: (_matrices(3, 4),)),
    "householder_product": (
        lambda a, tau: torch.linalg.householder_product(a, tau),
        lambda: (_matrices(5, 3), _matrices(3)),
    ),
}
if hasattr(torch.ops.aten, "cholesky"):  # the legacy torch.cholesky: removed in torch 2.15
    CASES["cholesky_legacy"] = (lambda a: torch.cholesky(a, upper=True), lambda: (_spd(3),))


@pytest.mark.parametrize("name", sorted(CASES))
def test_linalg_matches_pytorch(name: str, export_and_compare: Callable[..., fx2onnx.ONNXProgram]) -> None:
    fn, make_inputs = CASES[name]
    program = export_and_compare(Apply(fn), make_inputs())
    domains = {node.domain for node in program.model_proto.graph.node}
    assert "" in domains  # the factorization is written out in standard ONNX ops


def test_pivots_are_one_based_int32(tmp_path) -> None:
    a = torch.tensor([[1.0, 5.0, 2.0], [3.0, -7.0, 1.0], [-3.0, 2.0, 4.0]])
    program = export_program(Apply(torch.linalg.lu_factor), (a,), tmp_path=tmp_path)
    lu, pivots = program(a)
    expected_lu, expected_pivots = torch.linalg.lu_factor(a)
    assert pivots.dtype == torch.int32
    assert pivots.tolist() == expected_pivots.tolist()
    torch.testing.assert_close(lu, expected_lu)


def test_dynamic_batch_dims(tmp_path, export_and_compare: Callable[..., fx2onnx.ONNXProgram]) -> None:
    batch = torch.export.Dim("batch")
    options = make_options(tmp_path, dynamic_shapes=(({0: batch}, {0: batch}),))  # Apply's *args
    export_and_compare(
        Apply(torch.linalg.solve),
        (_matrices(2, 4, 4), _matrices(2, 4, 2)),
        options=options,
        second_inputs=((_matrices(5, 4, 4), _matrices(5, 4, 2)), {}),
    )


def test_symbolic_matrix_size_is_refused_clearly(tmp_path) -> None:
    size = torch.export.Dim("size")
    options = make_options(tmp_path, dynamic_shapes=(({0: size, 1: size},),))
    with pytest.raises(fx2onnx.OnnxExporterError, match="matrix size to be static"):
        export_program(Apply(torch.linalg.inv), (_matrices(4, 4),), options=options, tmp_path=tmp_path)


def test_full_svd_of_non_square_is_refused_clearly(tmp_path) -> None:
    with pytest.raises(fx2onnx.OnnxExporterError, match="full_matrices=False"):
        export_program(Apply(torch.linalg.svd), (_matrices(4, 3),), tmp_path=tmp_path)


def test_size_limit_is_stated() -> None:
    class Value:
        shape = (linalg_functions.MAX_UNROLLED_SIZE + 1,) * 2

    with pytest.raises(ValueError, match="larger than"):
        linalg_functions._static_size(Value(), -1, "linalg_inv")
    with pytest.raises(ValueError, match="larger than"):
        linalg_functions._static_size(Value(), -1, "linalg_eigh", limit=linalg_functions.MAX_EIGH_SIZE)
    with pytest.raises(ValueError, match="larger than"):
        linalg_functions._check_jacobi_size(linalg_functions.MAX_EIGH_SIZE + 1, "linalg_svd")
