"""Type promotion: ONNX Runtime computes in the dtypes PyTorch computes with.

A table of dtype pairs x binary ops (and tensor x Python scalar): the exported model's
output dtype must equal PyTorch's and the values must match. One model per dtype pair
holds every op that PyTorch accepts for that pair, so the table exports fast.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

import pytest
import torch

import fx2onnx
from diagnostics import rules

DTYPES = [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float16, torch.float32, torch.float64]

OPS: dict[str, Callable[[Any, Any], torch.Tensor]] = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "floor_divide": torch.floor_divide,
    "remainder": torch.remainder,
    "pow": torch.pow,
    "eq": torch.eq,
    "lt": torch.lt,
    "maximum": torch.maximum,
    "where": lambda a, b: torch.where(torch.arange(6).reshape(2, 3) % 2 == 0, a, b),
}

SCALARS: dict[str, Any] = {"True": True, "3": 3, "2.5": 2.5}


def _operand(dtype: torch.dtype, salt: int) -> torch.Tensor:
    # small positive values: no division by zero, no negative integer powers, no overflow
    values = torch.tensor([[1, 2, 3], [4, 2, 1]]) + salt
    if dtype == torch.bool:
        return (values % 2 == 0) if salt == 0 else (values % 3 != 0)
    return (values % 5 + 1).to(dtype) if not dtype.is_floating_point else (values.to(dtype) / 2 + 0.25)


def _accepted(op: Callable, a: Any, b: Any) -> torch.Tensor | None:
    """PyTorch's result, or None when PyTorch itself rejects the pair."""
    try:
        return op(a, b)
    except (RuntimeError, TypeError):
        return None


class _Table(torch.nn.Module):
    def __init__(self, names: list[str], scalar: Any = None) -> None:
        super().__init__()
        self.names = names
        self.scalar = scalar

    def forward(self, a: torch.Tensor, b: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        other = self.scalar if b is None else b
        return {name: OPS[name](a, other) for name in self.names}


@functools.cache
def _exported(left: torch.dtype, right: torch.dtype | None, scalar_name: str | None) -> tuple[dict, dict]:
    """Export once per operand pair; PyTorch's and ONNX Runtime's results per op."""
    a = _operand(left, 0)
    b = _operand(right, 1) if right is not None else None
    other = SCALARS[scalar_name] if scalar_name is not None else b
    names = [name for name, op in OPS.items() if _accepted(op, a, other) is not None]
    if not names:
        return {}, {}
    model = _Table(names, other if right is None else None)
    inputs = (a,) if right is None else (a, b)
    expected = model(*inputs)
    program = fx2onnx.dynamo_export(model, *inputs, export_options=fx2onnx.ExportOptions(failure_report_path=None))
    return expected, program(*inputs)


def _one_ulp(dtype: torch.dtype) -> dict[str, float]:
    """One unit in the last place of ``dtype``, relative. Measured: onnxruntime's results equal
    PyTorch's exactly for every float16, float32 and float64 pair of the table; one ulp
    leaves room for a runtime whose pow or division rounds the other way, no more."""
    return dict(rtol=torch.finfo(dtype).eps, atol=torch.finfo(dtype).tiny)


def _check(expected: dict, actual: dict, op: str) -> None:
    assert op in expected, f"{op}: collected as a pair PyTorch accepts, but the export's table lacks it"
    want, got = expected[op], actual[op]
    assert got.dtype == want.dtype, f"{op}: ONNX gives {got.dtype}, PyTorch {want.dtype}"
    if want.dtype.is_floating_point:
        torch.testing.assert_close(got, want, equal_nan=True, **_one_ulp(want.dtype))
    else:
        assert torch.equal(got, want), f"{op}: {got} != {want}"


def _accepted_cases(others: dict[str, Any]) -> list[Any]:
    """(left dtype, other, op) for the combinations PyTorch accepts: a combination it
    rejects has nothing to compare and is not collected."""
    return [
        pytest.param(left, key, op, id=f"{left}-{key}-{op}")
        for left in DTYPES for key, other in others.items() for op in OPS
        if _accepted(OPS[op], _operand(left, 0), other) is not None
    ]


@pytest.mark.parametrize(("left", "right", "op"), _accepted_cases({str(d): _operand(d, 1) for d in DTYPES}))
def test_tensor_tensor(left: torch.dtype, right: str, op: str) -> None:
    right = next(d for d in DTYPES if str(d) == right)
    expected, actual = _exported(left, right, None)
    _check(expected, actual, op)


@pytest.mark.parametrize(("left", "scalar", "op"), _accepted_cases(SCALARS))
def test_tensor_scalar(left: torch.dtype, scalar: str, op: str) -> None:
    if (left, scalar, op) == (torch.bool, "True", "pow"):
        # torch.export's FakeTensor gives int64 here while eager PyTorch gives bool; the
        # ONNX graph follows the exported program.
        pytest.xfail("PyTorch's export metadata and eager disagree on pow(bool, True)")
    expected, actual = _exported(left, None, scalar)
    _check(expected, actual, op)


class _Reductions(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.cumsum(-1), x.sum(), x.sum(0), x.prod(-1)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float32], ids=str)
def test_reductions_widen_like_pytorch(dtype: torch.dtype) -> None:
    x = _operand(dtype, 0)
    model = _Reductions()
    program = fx2onnx.dynamo_export(model, x, export_options=fx2onnx.ExportOptions(failure_report_path=None))
    for got, want in zip(program(x), model(x)):
        assert got.dtype == want.dtype
        assert torch.equal(got, want)


class _Mixed(torch.nn.Module):
    def forward(self, i: torch.Tensor, h: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return i / 2, i * 1.5, h + f, (i > 1.5), torch.where(i > 2, i, f), i.float().exp() + i, torch.sigmoid(i)


def test_mixed_model_and_diagnostics_per_cast() -> None:
    i = torch.tensor([[1, 2, 3], [4, 5, 6]])
    h = torch.rand(2, 3, dtype=torch.float16)
    f = torch.rand(2, 3)
    model = _Mixed()
    options = fx2onnx.ExportOptions(
        failure_report_path=None, diagnostic_options=fx2onnx.DiagnosticOptions(verbosity_level=logging.DEBUG)
    )
    program = fx2onnx.dynamo_export(model, i, h, f, export_options=options)
    for got, want in zip(program(i, h, f), model(i, h, f)):
        assert got.dtype == want.dtype
        # measured: equal but for one float32 ulp (6e-8 at sigmoid's 0.73)
        torch.testing.assert_close(got, want, **(_one_ulp(want.dtype) if want.dtype.is_floating_point else {}))
    casts = [d for d in program.diagnostic_context.diagnostics if d.rule == rules.FX_NODE_INSERT_TYPE_PROMOTION]
    assert casts, "every inserted cast is explained by a diagnostic at DEBUG verbosity"
    assert all("cast to" in d.message for d in casts)
    assert any(d.location is not None and d.location.path.endswith("test_type_promotion.py") for d in casts)


def test_casts_not_recorded_at_default_verbosity() -> None:
    i = torch.tensor([1, 2, 3])
    program = fx2onnx.dynamo_export(_Mixed(), i, i.half(), i.float(), export_options=fx2onnx.ExportOptions(failure_report_path=None))
    assert not [d for d in program.diagnostic_context.diagnostics if d.rule == rules.FX_NODE_INSERT_TYPE_PROMOTION]


class _ByReadSize(torch.nn.Module):
    """Sizes read from a tensor's values (known at run time only) given to operators'
    Scalar arguments, whose ONNX functions may take the scalar as an attribute."""

    def forward(self, x: torch.Tensor, f: torch.Tensor, n: torch.Tensor):
        width = n.item()
        torch._check(width >= 1)
        return x % width, torch.pow(x, width), torch.fmod(f, width), f * width, x.float() / width


@pytest.mark.parametrize("n", [3, 5])
def test_sizes_known_at_run_time_as_scalar_arguments(n: int, export_and_compare) -> None:
    x, f = torch.arange(-6, 6), torch.randn(12) * 10
    program = export_and_compare(_ByReadSize(), (x, f, torch.tensor(n)), second_inputs=((x, f, torch.tensor(n + 1)), {}))
    diagnostics = program.diagnostic_context.diagnostics
    assert not [d for d in diagnostics if d.rule == rules.FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION and d.level.name == "WARNING"]
    for got, want in zip(program(x, f, torch.tensor(n)), _ByReadSize()(x, f, torch.tensor(n))):
        assert got.dtype == want.dtype


class _MixedConcatenation(torch.nn.Module):
    """Float zeros before int64 running totals (MusicFlamingo's audio offsets), and int32
    beside int64 lengths: PyTorch concatenates in the promoted dtype."""

    def forward(self, lengths: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        offsets = torch.cat([torch.zeros(1), torch.cumsum(lengths, dim=0)[:-1]])
        return offsets, torch.cat([counts, lengths]), torch.stack([lengths.float(), lengths.double()])


def test_concatenation_of_mixed_dtypes_computes_in_pytorchs_dtype(export_and_compare) -> None:
    lengths, counts = torch.tensor([3, 5, 2, 7]), torch.tensor([1, 2], dtype=torch.int32)
    options = fx2onnx.ExportOptions(failure_report_path=None, dynamic_shapes=True)
    program = export_and_compare(_MixedConcatenation(), (lengths, counts), options=options,
                                 second_inputs=((torch.tensor([4, 1, 6]), torch.tensor([9, 8, 7], dtype=torch.int32)), {}))
    for got, want in zip(program(lengths, counts), _MixedConcatenation()(lengths, counts)):
        assert got.dtype == want.dtype and torch.equal(got, want)
