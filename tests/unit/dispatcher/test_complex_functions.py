"""fx2onnx's complex implementations (dispatcher/functions/complex/) and complex
results of real inputs: each exported in a tiny model, run in onnxruntime through
ONNXProgram.__call__, and compared with PyTorch."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import fx2onnx
from dispatcher import OnnxRegistry
from dispatcher.functions.complex import COMPLEX_FUNCTIONS
from dispatcher.registry import _torchlib_functions


class _Model(torch.nn.Module):
    def __init__(self, function: Callable) -> None:
        super().__init__()
        self.function = function

    def forward(self, *args):
        return self.function(*args)


def _z(*shape: int) -> torch.Tensor:
    return torch.randn(shape, dtype=torch.complex64)


CASES: dict[str, tuple[Callable, Callable[[], tuple]]] = {
    "unsqueeze_negative": (lambda z: z.unsqueeze(-1), lambda: (_z(3, 4),)),
    "unsqueeze": (lambda z: z.unsqueeze(1), lambda: (_z(3, 4),)),
    "squeeze": (lambda z: z.unsqueeze(1).squeeze(), lambda: (_z(3, 4),)),
    "squeeze_dims": (lambda z: z.squeeze((0, 2)), lambda: (_z(1, 4, 1),)),
    "expand": (lambda z: z.expand(2, -1, 5), lambda: (_z(3, 1),)),
    "where": (lambda z: torch.where(z.real > 0, z, z * 2), lambda: (_z(3, 4),)),
    "constant_pad": (lambda z: torch.nn.functional.pad(z, (1, 2, 0, 1)), lambda: (_z(3, 4),)),
    "constant_pad_complex_value": (lambda z: torch.constant_pad_nd(z, (1, 2), 1 + 2j), lambda: (_z(3, 4),)),
    "reflect_pad": (lambda z: torch.nn.functional.pad(z, (1, 1), mode="reflect"), lambda: (_z(2, 3, 4),)),
    "replicate_pad_negative": (lambda z: torch.nn.functional.pad(z, (-1, 2, 1, -1), mode="replicate"), lambda: (_z(2, 3, 4),)),
    "circular_pad": (lambda z: torch.nn.functional.pad(z, (1, 2), mode="circular"), lambda: (_z(2, 3, 4),)),
    "mul_scalar": (lambda z: torch.ops.aten.mul.Scalar(z, 2 + 1j), lambda: (_z(3, 4),)),
    "to_complex128": (lambda z: z.to(torch.complex128), lambda: (_z(3),)),
    "to_real": (lambda z: z.to(torch.float32), lambda: (_z(3),)),
    "real_to_complex": (lambda x: x.to(torch.complex64), lambda: (torch.randn(3),)),
    "zeros_like": (lambda z: torch.zeros_like(z) + z, lambda: (_z(3, 4),)),
    "ones_like": (lambda z: torch.ones_like(z), lambda: (_z(3, 4),)),
    "full_like": (lambda z: torch.full_like(z, 2 - 1j), lambda: (_z(3, 4),)),
    "new_full": (lambda z: z.new_full((2, 2), 1 + 1j), lambda: (_z(3, 4),)),
    "new_zeros": (lambda z: z.new_zeros((2, 3)), lambda: (_z(3, 4),)),
    "diagonal": (lambda z: torch.diagonal(z, 1), lambda: (_z(3, 4),)),
    "diagonal_negative_offset": (lambda z: torch.diagonal(z, -1, 0, 2), lambda: (_z(3, 2, 4),)),
    "split_with_sizes": (lambda z: torch.split(z, [1, 3], dim=1), lambda: (_z(3, 4),)),
    "split": (lambda z: torch.split(z, 2, dim=-2), lambda: (_z(5, 4),)),
    "select": (lambda z: z[1], lambda: (_z(3, 4),)),
    "index": (lambda z: z[:, torch.tensor([0, 2])], lambda: (_z(3, 4),)),
    "index_put": (lambda z: torch.index_put(z, (torch.tensor([0, 2]),), z[0]), lambda: (_z(3, 4),)),
    "as_strided": (lambda z: torch.as_strided(z, (2, 2), (1, 2), 1), lambda: (_z(3, 4),)),
    "resolve_conj": (lambda z: z.conj().resolve_conj(), lambda: (_z(3, 4),)),
    "resolve_neg": (lambda z: (z * 2).resolve_neg(), lambda: (_z(3, 4),)),
    "div_scalar": (lambda z: torch.ops.aten.div.Scalar(z, 2.0), lambda: (_z(3, 4),)),
    "div_complex_scalar": (lambda z: torch.ops.aten.div.Scalar(z, 1 - 2j), lambda: (_z(3, 4),)),
    "cumsum": (lambda z: torch.cumsum(z, -1), lambda: (_z(3, 4),)),
    "sum_0d": (lambda z: z.sum(), lambda: (_z(),)),
    "sum_dim_dtype": (lambda z: torch.sum(z, (0, -1), keepdim=True, dtype=torch.complex128), lambda: (_z(3, 4, 2),)),
    "sum_dim_0d": (lambda z: torch.sum(z, 0), lambda: (_z(),)),
    "mean_0d": (lambda z: z.mean(), lambda: (_z(),)),
    "mm": (lambda a, b: torch.mm(a, b), lambda: (_z(3, 4), _z(4, 2))),
    "bmm": (lambda a, b: torch.bmm(a, b), lambda: (_z(2, 3, 4), _z(2, 4, 2))),
    "mv": (lambda a, v: torch.mv(a, v), lambda: (_z(3, 4), _z(4))),
    "dot": (lambda a, b: torch.dot(a, b), lambda: (_z(4), _z(4))),
    "addmm": (lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2 - 1j), lambda: (_z(3, 2), _z(3, 4), _z(4, 2))),
    "log": (lambda z: torch.log(z), lambda: (_z(3, 4),)),
    "log10": (lambda z: torch.log10(z), lambda: (_z(3, 4),)),
    "log2": (lambda z: torch.log2(z), lambda: (_z(3, 4),)),
    "vector_norm": (lambda z: torch.linalg.vector_norm(z), lambda: (_z(3, 4),)),
    "vector_norm_ord1_dim": (lambda z: torch.linalg.vector_norm(z, 1, dim=1, keepdim=True), lambda: (_z(3, 4),)),
    "vector_norm_inf": (lambda z: torch.linalg.vector_norm(z, float("inf")), lambda: (_z(3, 4),)),
    "var": (lambda z: torch.var(z, dim=1), lambda: (_z(3, 4),)),
    "var_all": (lambda z: torch.var(z), lambda: (_z(3, 4),)),
    "gather": (lambda z: torch.gather(z, 1, torch.tensor([[0, 2], [1, 1], [3, 0]])), lambda: (_z(3, 4),)),
    "nonzero": (lambda z: torch.nonzero(z * (z.real > 0)), lambda: (_z(3, 4),)),
    "nonzero_0d": (lambda z: torch.nonzero(z), lambda: (_z(),)),
    "eq": (lambda a, b: a == b, lambda: (_z(3, 4), _z(3, 4))),
    "ne": (lambda a: a != a * (a.real > 0), lambda: (_z(3, 4),)),
    "prims_div": (lambda a, b: torch.ops.prims.div(a, b), lambda: (_z(3, 4), _z(3, 4))),
    "exp": (lambda z: torch.exp(z), lambda: (_z(3, 4),)),
    "var_mean": (lambda z: torch.var_mean(z, dim=1), lambda: (_z(3, 4),)),
    # complex results of nodes without complex inputs
    "full_complex_value": (lambda x: torch.full((2, 3), 1 + 2j) + x, lambda: (_z(2, 3),)),
    "zeros": (lambda x: torch.zeros(2, dtype=torch.complex64) + x, lambda: (_z(2),)),
    "ones": (lambda x: torch.ones(2, 3, dtype=torch.complex64), lambda: (_z(2),)),
    "eye": (lambda x: torch.eye(3, dtype=torch.complex64), lambda: (_z(2),)),
    "linspace": (lambda x: torch.linspace(0, 1, 5, dtype=torch.complex64), lambda: (_z(2),)),
    "scalar_tensor": (lambda x: torch.scalar_tensor(3, dtype=torch.complex64), lambda: (_z(2),)),
    "empty_result": (lambda z: z[:, :0] * 2, lambda: (_z(3, 4),)),
}


# PyTorch's own warning on the eager run of `to_real` (the case casts on purpose)
@pytest.mark.filterwarnings("ignore:Casting complex values to real discards the imaginary part:UserWarning")
@pytest.mark.parametrize("name", sorted(CASES))
def test_complex_function_matches_pytorch(name: str, tmp_path) -> None:
    function, make_inputs = CASES[name]
    inputs = make_inputs()
    expected = function(*inputs)
    program = fx2onnx.dynamo_export(
        _Model(function), *inputs, export_options=fx2onnx.ExportOptions(failure_report_path=tmp_path / "r.sarif")
    )
    actual = program(*inputs)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)


def test_complex_functions_are_defaults_after_torchlib() -> None:
    registry = OnnxRegistry()
    functions = registry.get_op_functions("aten", "unsqueeze")
    assert [(f.is_custom, f.is_complex) for f in functions] == [(False, False), (False, True)]
    assert functions[-1].name == "complex_unsqueeze"
    assert not list(registry.custom_functions())


def test_complex_functions_only_extend_overloads_torchlib_implements() -> None:
    # A complex-only entry would hide the real fallback of real calls of that overload:
    # torchlib or one of fx2onnx's real tables implements each one.
    registry = OnnxRegistry()
    real = {key for key, _ in _torchlib_functions()}
    real |= {f.qualified_name for key in registry.all_registered_ops() for f in registry.get_functions(key) or () if not f.is_complex}
    for names, _ in COMPLEX_FUNCTIONS:
        for name in names:
            key = registry.get_functions(name)[0].qualified_name
            assert key in real, name


def test_user_complex_registration_wins() -> None:
    import onnxscript
    from onnxscript import opset18 as op

    def negate(self, dim: int):
        return op.Neg(op.Unsqueeze(self, op.Constant(value_ints=[dim])))

    registry = OnnxRegistry()
    mine = onnxscript.values.TracedOnnxFunction(onnxscript.values.Opset("pkg.test", 1), negate)
    registry.register_op(mine, "aten", "unsqueeze", is_complex=True)
    z = _z(3)
    program = fx2onnx.dynamo_export(
        _Model(lambda z: z.unsqueeze(0)), z, export_options=fx2onnx.ExportOptions(onnx_registry=registry, failure_report_path=None)
    )
    torch.testing.assert_close(program(z), -z.unsqueeze(0))
