"""Run PyTorch OpInfo samples through an ONNX exporter and compare with eager PyTorch.

Shared by `bench/opinfo_coverage.py` (the full side-by-side benchmark),
`tests/unit/dispatcher/test_opinfo_subset.py` (a fast regression subset) and `bench/module_coverage.py`
(torch.nn modules, through `run_module`).

One OpInfo sample becomes an `nn.Module` whose inputs are the tensor leaves of
(sample.input, sample.args, sample.kwargs); everything else (ints, dims, dtypes, ...)
is closed over. The module is exported, run in onnxruntime and compared with eager.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

# Operators whose samples are random, or whose results depend on uninitialized memory.
RANDOM_OPS = frozenset(
    {
        "normal", "normal.number_mean", "normal.in_place", "bernoulli", "multinomial", "uniform",
        "rand_like", "randint_like", "randn_like", "randint", "randn", "rand",
        "exponential", "geometric", "log_normal", "cauchy",
        "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
        "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
        "nn.functional.rrelu", "nn.functional.multi_head_attention_forward",
        "torch.ops.aten._efficient_attention_forward", "torch._C._nn._test_optional_floatlist",
    }
)
# Operators that hang or take minutes on some samples.
SLOW_OPS = frozenset(set())
SAMPLES_PER_OP = 3
EXPORTERS = ("fx2onnx", "torch")


def is_random(name: str) -> bool:
    return name in RANDOM_OPS or name.startswith(("normal", "bernoulli"))


def compares_shape_only(name: str) -> bool:
    """Results of these operators are uninitialized memory: only shape and dtype count."""
    return name.startswith(("empty", "new_empty")) or name in {"empty_like", "empty_strided"}


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """One tolerance for both exporters."""
    if dtype in (torch.float16, torch.bfloat16):
        return {"rtol": 1e-2, "atol": 1e-2}
    return {"rtol": 1e-3, "atol": 1e-4}


def quiet() -> None:
    """Silence warnings and the exporters' logging."""
    warnings.filterwarnings("ignore")
    for name in ("torch", "torch.onnx", "torch.export", "torch._dynamo", "onnxscript", "onnx_ir", "fx2onnx"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import onnxruntime

        onnxruntime.set_default_logger_severity(4)  # failures are reported per sample
    except ImportError:
        pass


def op_infos(dtype: torch.dtype, names: list[str] | None = None) -> list[Any]:
    """OpInfos that support `dtype` on CPU, optionally only those named."""
    from torch.testing._internal.common_methods_invocations import op_db

    wanted = set(names) if names else None
    result = []
    for opinfo in op_db:
        full_name = opinfo_name(opinfo)
        if wanted is not None and full_name not in wanted and opinfo.name not in wanted:
            continue
        if dtype not in opinfo.supported_dtypes("cpu"):
            continue
        result.append(opinfo)
    return result


def opinfo_name(opinfo: Any) -> str:
    return f"{opinfo.name}.{opinfo.variant_test_name}" if opinfo.variant_test_name else opinfo.name


def samples(opinfo: Any, dtype: torch.dtype, limit: int = SAMPLES_PER_OP) -> list[Any]:
    torch.manual_seed(0)
    result = []
    for sample in opinfo.sample_inputs("cpu", dtype, requires_grad=False):
        result.append(sample)
        if len(result) >= limit:
            break
    return result


class SampleModule(torch.nn.Module):
    """Calls `op(input, *args, **kwargs)` with the tensor leaves taken from forward()."""

    def __init__(self, op: Callable[..., Any], leaves: list[Any], spec: Any, tensor_positions: list[int]) -> None:
        super().__init__()
        self.op = op
        self.leaves = leaves
        self.spec = spec
        self.tensor_positions = tensor_positions

    def forward(self, *tensors: torch.Tensor) -> Any:
        leaves = list(self.leaves)
        for position, tensor in zip(self.tensor_positions, tensors):
            leaves[position] = tensor
        input_, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.op(input_, *args, **kwargs)


def wrap_sample(opinfo: Any, sample: Any) -> tuple[SampleModule, list[torch.Tensor]]:
    """The module and its tensor inputs for one sample."""
    leaves, spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    inputs = [leaves[i] for i in positions]
    closed = [None if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
    return SampleModule(opinfo.op, closed, spec, positions), inputs


def tensor_leaves(outputs: Any) -> list[torch.Tensor]:
    """Tensor outputs; Python numbers (`item`, `Tensor.tolist`) count as 0-d tensors."""
    leaves = pytree.tree_leaves(outputs)
    return [
        leaf if isinstance(leaf, torch.Tensor) else torch.as_tensor(leaf)
        for leaf in leaves
        if isinstance(leaf, (torch.Tensor, bool, int, float, complex))
    ]


def clone_all(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in tensors]


@dataclass
class SampleResult:
    status: str  # pass, export, onnxruntime, mismatch, eager (the sample fails in PyTorch), timeout
    reason: str = ""
    rule: str = ""  # fx2onnx: the rule id of the first error diagnostic ("" when there is none)
    dtype_mismatch: bool = False

    @property
    def passed(self) -> bool:
        return self.status == "pass"


def first_line(text: str) -> str:
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def export_fx2onnx(module: torch.nn.Module, inputs: list[torch.Tensor]) -> Callable[..., Any]:
    import fx2onnx

    program = fx2onnx.dynamo_export(
        module, *inputs, export_options=fx2onnx.ExportOptions(failure_report_path=None)
    )
    return program


_TORCH_REGISTRIES: dict[Any, Any] = {}


def cache_torch_registry() -> None:
    """torch.onnx.export builds its torchlib registry anew on every call (seconds each);
    the benchmark builds it once per opset. The export itself is unchanged."""
    from torch.onnx._internal.exporter import _registration

    registry_class = _registration.ONNXRegistry
    if getattr(registry_class.from_torchlib, "_fx2onnx_cached", False):
        return
    build = registry_class.from_torchlib

    def from_torchlib(*args: Any, **kwargs: Any) -> Any:
        key = (args, tuple(sorted(kwargs.items())))
        if key not in _TORCH_REGISTRIES:
            _TORCH_REGISTRIES[key] = build(*args, **kwargs)
        return _TORCH_REGISTRIES[key]

    from_torchlib._fx2onnx_cached = True  # type: ignore[attr-defined]
    registry_class.from_torchlib = staticmethod(from_torchlib)


def export_torch(module: torch.nn.Module, inputs: list[torch.Tensor]) -> Callable[..., Any]:
    cache_torch_registry()
    return torch.onnx.export(module, tuple(inputs), dynamo=True, verbose=False)


EXPORT_FUNCTIONS = {"fx2onnx": export_fx2onnx, "torch": export_torch}


def describe_export_failure(exporter: str, error: BaseException) -> tuple[str, str]:
    """(rule id, first line of the reason) for an export failure."""
    if exporter == "fx2onnx":
        program = getattr(error, "onnx_program", None)
        context = getattr(program, "diagnostic_context", None)
        errors = context.errors() if context is not None else []
        if errors:
            diagnostic = errors[0]
            return diagnostic.rule.id, first_line(diagnostic.message)
        return "", f"{type(error).__name__}: {first_line(error)}"
    return "", f"{type(error).__name__}: {first_line(error)}"


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Raise _Timeout after `seconds` (main thread, POSIX only; None: no limit)."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def _raise(signum, frame):  # noqa: ARG001
        raise _Timeout(f"timed out after {seconds} s")

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def compare(expected: Any, actual: Any, dtype: torch.dtype, shape_only: bool) -> tuple[bool, bool, str]:
    """(values match, dtypes differ, reason)."""
    expected_leaves = tensor_leaves(expected)
    actual_leaves = tensor_leaves(actual)
    if len(expected_leaves) != len(actual_leaves):
        return False, False, f"{len(actual_leaves)} tensor outputs, PyTorch gives {len(expected_leaves)}"
    # A complex result returned in its ONNX form (real, trailing dim of 2) is read as complex
    # for either exporter: the values are compared, not the runner's output conversion.
    actual_leaves = [
        torch.complex(a[..., 0], a[..., 1]) if e.is_complex() and not a.is_complex()
        and a.dim() == e.dim() + 1 and a.shape[-1] == 2 and a.dtype in (torch.float32, torch.float64) else a
        for e, a in zip(expected_leaves, actual_leaves)
    ]
    dtype_differs = any(e.dtype != a.dtype for e, a in zip(expected_leaves, actual_leaves))
    for index, (e, a) in enumerate(zip(expected_leaves, actual_leaves)):
        if tuple(e.shape) != tuple(a.shape):
            return False, dtype_differs, f"output {index}: shape {tuple(a.shape)}, PyTorch gives {tuple(e.shape)}"
        if shape_only:
            continue
        try:
            torch.testing.assert_close(
                a, e, check_dtype=False, equal_nan=True, check_device=False, check_stride=False, **tolerance(dtype)
            )
        except AssertionError as error:
            lines = [line for line in str(error).splitlines() if line.strip()]
            return False, dtype_differs, f"output {index}: " + "; ".join(lines[:3])[:300]
        except Exception as error:  # noqa: BLE001 - dtype combinations assert_close refuses
            return False, dtype_differs, f"output {index}: {type(error).__name__}: {first_line(error)}"
    return True, dtype_differs, ""


def run_sample(
    exporter: str,
    opinfo: Any,
    sample: Any,
    dtype: torch.dtype,
    seconds: float | None = None,
) -> SampleResult:
    """Export one OpInfo sample, run it in onnxruntime, compare with eager; never raises."""
    module, inputs = wrap_sample(opinfo, sample)
    return run_module(exporter, module, inputs, dtype, seconds, shape_only=compares_shape_only(opinfo_name(opinfo)))


def run_module(
    exporter: str,
    module: torch.nn.Module,
    inputs: list[torch.Tensor],
    dtype: torch.dtype,
    seconds: float | None = None,
    shape_only: bool = False,
) -> SampleResult:
    """Export `module` on `inputs`, run it in onnxruntime, compare with eager; never raises."""
    try:
        with torch.no_grad():
            expected = module(*clone_all(inputs))
    except Exception as error:  # noqa: BLE001
        return SampleResult("eager", f"{type(error).__name__}: {first_line(error)}")
    sink = io.StringIO()
    stage = "export"
    try:
        with time_limit(seconds), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            try:
                program = EXPORT_FUNCTIONS[exporter](module, clone_all(inputs))
                if program is None:
                    raise RuntimeError("the exporter returned no program")
            except _Timeout:
                raise
            except Exception as error:  # noqa: BLE001
                rule, reason = describe_export_failure(exporter, error)
                return SampleResult("export", reason, rule)
            stage = "onnxruntime"
            try:
                actual = program(*clone_all(inputs))
            except _Timeout:
                raise
            except Exception as error:  # noqa: BLE001
                return SampleResult("onnxruntime", f"{type(error).__name__}: {first_line(error)}")
    except _Timeout as error:
        return SampleResult("timeout", f"{stage}: {error}")
    ok, dtype_differs, reason = compare(expected, actual, dtype, shape_only)
    if not ok:
        return SampleResult("mismatch", reason, dtype_mismatch=dtype_differs)
    return SampleResult("pass", dtype_mismatch=dtype_differs)


@dataclass
class OpResult:
    name: str
    results: dict[str, list[SampleResult]] = field(default_factory=dict)
    skipped: str = ""

    def passed(self, exporter: str) -> bool:
        samples = [r for r in self.results.get(exporter, []) if r.status != "eager"]
        return bool(samples) and all(r.passed for r in samples)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "skipped": self.skipped,
            "results": {k: [asdict(r) for r in v] for k, v in self.results.items()},
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> "OpResult":
        return OpResult(
            data["name"],
            {k: [SampleResult(**r) for r in v] for k, v in data["results"].items()},
            data.get("skipped", ""),
        )


def run_op(
    opinfo: Any,
    dtype: torch.dtype,
    exporters: tuple[str, ...] = EXPORTERS,
    limit: int = SAMPLES_PER_OP,
    seconds: float | None = 60,
) -> OpResult:
    name = opinfo_name(opinfo)
    result = OpResult(name)
    if is_random(opinfo.name) or name in SLOW_OPS:
        result.skipped = "random" if is_random(opinfo.name) else "slow"
        return result
    try:
        op_samples = samples(opinfo, dtype, limit)
    except Exception as error:  # noqa: BLE001
        result.skipped = f"samples: {type(error).__name__}: {first_line(error)}"
        return result
    if not op_samples:
        result.skipped = "no samples"
        return result
    for exporter in exporters:
        result.results[exporter] = [run_sample(exporter, opinfo, s, dtype, seconds) for s in op_samples]
    return result
