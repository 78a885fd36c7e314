"""Orthogonal polynomials of torch.special (dispatcher/functions/polynomial.py): the
degree is data, evaluated by an ONNX Loop; each exported in a tiny model, run in
onnxruntime and compared with PyTorch, including n < 0, n = 0, |x| = 1, x = 0, large
|x|, high degrees and NaN."""

from __future__ import annotations

import pytest
import torch

from conftest import all_nodes

POLYNOMIALS = [
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
]


class _Binary(torch.nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.function = getattr(torch.special, name)

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        # NaN made a number so that where NaN appears is compared too.
        return torch.nan_to_num(self.function(x, n), nan=-123.0, posinf=1e30, neginf=-1e30)


class _ScalarDegree(torch.nn.Module):
    def __init__(self, name: str, n: int) -> None:
        super().__init__()
        self.function, self.n = getattr(torch.special, name), n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(x, self.n)


class _ScalarX(torch.nn.Module):
    def __init__(self, name: str, x: float) -> None:
        super().__init__()
        self.function, self.x = getattr(torch.special, name), x

    def forward(self, n: torch.Tensor) -> torch.Tensor:
        return self.function(self.x, n)


def _grid() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.tensor([-7.5, -2.0, -1.0, -0.99, -0.5, 0.0, 0.3, 0.5, 0.99, 1.0, 1.5, 4.0, float("nan")])
    n = torch.tensor([-3.0, -0.5, 0.0, 0.9, 1.0, 2.0, 3.0, 5.0, 7.0, 8.0, 9.0, 12.0, 17.5])
    return x[:, None].expand(13, 13).contiguous(), n[None, :].expand(13, 13).contiguous()


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_tensor_degree(name: str, export_and_compare) -> None:
    x, n = _grid()
    # Other degrees at run time than at export: the Loop's trip count follows the data.
    second = (torch.rand(13, 13) * 2 - 1, torch.randint(0, 25, (13, 13)).float())
    program = export_and_compare(_Binary(name), (x, n), second_inputs=(second, {}))
    assert "Loop" in {node.op_type for node in all_nodes(program.model_proto)}


@pytest.mark.parametrize("name", ["chebyshev_polynomial_u", "hermite_polynomial_h", "legendre_polynomial_p"])
def test_polynomial_scalar_overloads(name: str, export_and_compare) -> None:
    x, n = _grid()
    export_and_compare(_ScalarDegree(name, 6), (x[:-1, 0],))  # without NaN
    export_and_compare(_ScalarX(name, 0.75), (n[0],))


def test_polynomial_integer_inputs_compute_in_float(export_and_compare) -> None:
    x = torch.tensor([-3, -1, 0, 1, 2, 5])
    n = torch.tensor([4, 3, 2, 1, 0, 6])
    export_and_compare(_Binary("chebyshev_polynomial_t"), (x, n))
    export_and_compare(_Binary("laguerre_polynomial_l"), (x.float(), n))


def test_hermite_beyond_pytorch_limit_is_nan(export_and_compare) -> None:
    x = torch.tensor([0.5, 0.5, 0.1])
    n = torch.tensor([127.0, 129.0, 3.0])
    export_and_compare(_Binary("hermite_polynomial_he"), (x, n))
