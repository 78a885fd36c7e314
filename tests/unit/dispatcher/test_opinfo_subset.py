"""A fast subset of the OpInfo coverage benchmark (`bench/opinfo_coverage.py`).

Every listed operator passes today with fx2onnx on its first OpInfo samples: exported,
run in onnxruntime and compared with eager PyTorch. A failure here is a regression.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("expecttest")  # torch.testing._internal needs it
torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import opinfo_harness as harness  # noqa: E402

FLOAT32_OPS = [
    "abs", "add", "addmm", "argmax", "atan2", "bmm", "cat", "clamp", "cumsum",
    "div.no_rounding_mode", "exp", "gather", "le", "logsumexp", "matmul", "mean", "mul",
    "nn.functional.conv2d", "nn.functional.gelu", "nn.functional.layer_norm",
    "nn.functional.linear", "nn.functional.relu", "permute", "pow", "rsqrt", "sort",
    "split", "stack", "sum", "topk", "transpose", "where",
    "bfloat16", "special.entr",  # bfloat16 through DLPack; mixed Python numbers in one op
]
COMPLEX64_OPS = [
    "add", "mul", "sub", "neg", "permute", "cat",
    # fx2onnx's complex implementations (dispatcher/functions/complex/)
    "unsqueeze", "expand", "where", "constant_pad_nd", "nn.functional.pad.circular", "index_put",
    "diagonal", "split_with_sizes", "squeeze", "cumsum", "new_full", "mm", "dot", "log10",
    "linalg.vector_norm", "var", "zeros_like", "trapz", "masked.sum",
    "nn.functional.pad.replicate_negative",
    # complex results of real inputs, 0-d complex results
    "full", "zeros", "eye", "linspace", "sum", "mean", "scalar_tensor",
    # decomposed through PyTorch's composite kernels
    "einsum", "tensordot", "hstack", "trace",
]
SAMPLES = 2


def _by_name(dtype: torch.dtype) -> dict[str, object]:
    return {harness.opinfo_name(o): o for o in harness.op_infos(dtype)}


@pytest.fixture(scope="module")
def float32_ops() -> dict[str, object]:
    harness.quiet()
    return _by_name(torch.float32)


@pytest.fixture(scope="module")
def complex64_ops() -> dict[str, object]:
    harness.quiet()
    return _by_name(torch.complex64)


def _check(opinfo: object, dtype: torch.dtype) -> None:
    result = harness.run_op(opinfo, dtype, exporters=("fx2onnx",), limit=SAMPLES, seconds=60)
    assert not result.skipped, result.skipped
    samples = result.results["fx2onnx"]
    failures = [s for s in samples if not s.passed and s.status != "eager"]
    assert not failures, "; ".join(f"{s.status}: {s.rule} {s.reason}" for s in failures)
    # a sample that fails in eager PyTorch compares nothing: at least one must have been compared
    assert any(s.passed for s in samples), f"no sample compared: {[s.status for s in samples]}"


@pytest.mark.parametrize("name", FLOAT32_OPS)
def test_float32(name: str, float32_ops: dict[str, object]) -> None:
    _check(float32_ops[name], torch.float32)


@pytest.mark.parametrize("name", COMPLEX64_OPS)
def test_complex64(name: str, complex64_ops: dict[str, object]) -> None:
    _check(complex64_ops[name], torch.complex64)


@pytest.mark.parametrize("statuses", [["eager", "eager"], ["pass", "mismatch"]])
def test_the_check_fails_when_nothing_is_compared_or_a_sample_differs(statuses: list[str], monkeypatch) -> None:
    """Planted results: every sample failing in eager PyTorch (nothing compared), or one mismatch."""
    planted = harness.OpResult("planted", {"fx2onnx": [harness.SampleResult(status) for status in statuses]})
    monkeypatch.setattr(harness, "run_op", lambda *args, **kwargs: planted)
    with pytest.raises(AssertionError, match="no sample compared" if "pass" not in statuses else "mismatch"):
        _check(object(), torch.float32)
