"""Shared helpers of the end-to-end tests: export, save, check, run in onnxruntime, compare."""

from __future__ import annotations

import ast
import collections
import io
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.inliner
import pytest
import torch
import torch.utils._pytree as pytree

import fx2onnx
from sarif_checks import validate_sarif

# The suite's float32 tolerance against eager float32 PyTorch (the exporter's `--verify`
# default too). Measured: a two-layer LLaMA's logits differ by 2.4e-7 and a BERT's hidden
# states by 7.2e-7 (export-hf folders); special functions, whose onnxruntime formulas differ
# from PyTorch's, stay within it over their whole grid. A wrong kernel is off by the size
# of the values, a thousand times more.
RTOL = 1e-3
ATOL = 1e-4

# Warnings that PyTorch, transformers and onnxscript print during exports, each filtered by
# the module it is attributed to or by its own message: fx2onnx's warnings (a strict-mode
# fallback, a dim made static, ...) and the deprecations fx2onnx's own calls trigger show.
_UPSTREAM = r"(torch|transformers|onnxscript|onnx_ir|onnx|onnxruntime|torchvision|timm|jsonschema|google\.protobuf|_pytest)(\.|$)"
_NOISY_WARNINGS = (
    f"ignore::DeprecationWarning:{_UPSTREAM}",
    f"ignore::FutureWarning:{_UPSTREAM}",
    # torch's pytree deprecation, attributed to copyreg when a graph module is deep-copied
    r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning",
    "ignore:.*TracerWarning.*",
    "ignore:.*enable_nested_tensor.*:UserWarning",
    "ignore:The tensor attributes .* were assigned during export:UserWarning",
)


def pytest_configure(config: pytest.Config) -> None:
    for line in _NOISY_WARNINGS:
        config.addinivalue_line("filterwarnings", line)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _share_the_cores(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


def _share_the_cores(workers: int) -> None:
    """Under `pytest -n`, each worker's torch and onnxruntime take their share of the cores,
    without spinning: every worker's thread pools sized to the whole machine and waiting by
    spinning would fight each other for the same cores (subprocesses read OMP_NUM_THREADS)."""
    import onnxruntime

    threads = max(1, (os.cpu_count() or 1) // max(1, workers))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)

    class SharedCoresSession(onnxruntime.InferenceSession):
        def __init__(self, path_or_bytes: Any, sess_options: Any = None, *args: Any, **kwargs: Any) -> None:
            sess_options = sess_options if sess_options is not None else onnxruntime.SessionOptions()
            if sess_options.intra_op_num_threads == 0:  # onnxruntime's default: every core
                sess_options.intra_op_num_threads = threads
                sess_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            super().__init__(path_or_bytes, sess_options, *args, **kwargs)

    onnxruntime.InferenceSession = SharedCoresSession


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason.removeprefix("Skipped: ")


def _test_functions(path: str) -> int:
    """The test functions a module skipped at collection defines (its parametrizations,
    computed on import, cannot be counted)."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    return sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test") for n in ast.walk(tree))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """How many tests were skipped, by reason; a module skipped at collection is counted
    with the test functions it holds."""
    tests: collections.Counter[str] = collections.Counter()
    modules: dict[str, list[str]] = collections.defaultdict(list)
    for report in terminalreporter.stats.get("skipped", []):
        if isinstance(report, pytest.CollectReport):
            modules[_skip_reason(report)].append(report.nodeid)
        else:
            tests[_skip_reason(report)] += 1
    if not tests and not modules:
        return
    terminalreporter.write_sep("=", "skipped, by reason")
    for reason, count in tests.most_common():
        terminalreporter.write_line(f"{count} test(s): {reason}")
    root = Path(str(terminalreporter.config.rootpath))
    for reason, nodeids in sorted(modules.items()):
        functions = sum(_test_functions(os.fspath(root / nodeid)) for nodeid in nodeids)
        terminalreporter.write_line(f"{len(nodeids)} module(s) not collected, {functions} test functions in them: {reason}")


@pytest.fixture(autouse=True)
def _seed_torch() -> Iterator[None]:
    torch.manual_seed(0)
    yield


@pytest.fixture(params=[True, False], ids=["functions", "flat"])
def module_functions(request: pytest.FixtureRequest) -> bool:
    """Both modes of an export: each module call as an ONNX function (the default) and one
    flat graph; a test taking it runs in each."""
    return request.param


def inlined(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every model-local function call replaced by its body: the graph the
    runtime computes, the same in both modes (node counts compare)."""
    return onnx.inliner.inline_local_functions(model)


def make_options(tmp_path: Path | None, **kwargs: Any) -> fx2onnx.ExportOptions:
    """ExportOptions whose failure report goes to tmp_path (never to the repository root)."""
    kwargs.setdefault("failure_report_path", None if tmp_path is None else tmp_path / "r.sarif")
    return fx2onnx.ExportOptions(**kwargs)


def validate_written_reports(folder: Path) -> None:
    """Every SARIF file a test wrote must be valid SARIF 2.1.0."""
    for path in Path(folder).glob("*.sarif"):
        validate_sarif(path)


def flat_leaves(outputs: Any) -> list[Any]:
    leaves, _ = pytree.tree_flatten(outputs)
    return leaves


def assert_outputs_close(actual: Any, expected: Any, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Same structure, same tensors within tolerance (dtypes must match too)."""
    actual_leaves, actual_spec = pytree.tree_flatten(actual)
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    assert actual_spec == expected_spec, f"output structure differs:\n  onnx:  {actual_spec}\n  torch: {expected_spec}"
    for index, (got, want) in enumerate(zip(actual_leaves, expected_leaves)):
        if isinstance(want, torch.Tensor):
            assert isinstance(got, torch.Tensor), f"output {index}: expected a tensor, got {type(got).__name__}"
            torch.testing.assert_close(got, want.detach(), rtol=rtol, atol=atol, msg=lambda m, i=index: f"output {i}: {m}")
        else:
            assert got == want, f"output {index}: {got!r} != {want!r}"


def all_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """Nodes of the main graph, of its sub-graphs and of every model-local function."""

    def walk(nodes: Sequence[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
        for node in nodes:
            yield node
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    yield from walk(attribute.g.node)
                for graph in attribute.graphs:
                    yield from walk(graph.node)

    yield from walk(model.graph.node)
    for function in model.functions:
        yield from walk(function.node)


def decoder_stack_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """A decoder's main graph as its layers are exported: the nodes of the one guard for
    the whole stack's second branch (`onnx_passes.decoder_stack_guard`, each layer
    guarded; its outputs named as the model's with ``EXACT_SUFFIX``) in place of that `If`."""
    from fx2onnx.onnx_passes.decoder_stack_guard import STACK_GUARD

    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type == "If" and node.name == STACK_GUARD:
            nodes.extend(next(a.g for a in node.attribute if a.name == "else_branch").node)
        else:
            nodes.append(node)
    return nodes


def op_types(model: onnx.ModelProto) -> set[str]:
    return {node.op_type for node in all_nodes(model)}


def translated_fx_targets(model: onnx.ModelProto) -> set[str]:
    """The FX nodes the exporter translated, read from the ONNX nodes' metadata."""
    targets = set()
    for node in all_nodes(model):
        for prop in node.metadata_props:
            if prop.key == "pkg.fx2onnx.fx_node":
                targets.add(prop.value)
    return targets


def matmul_nbits_weights(graph: onnx.GraphProto) -> list[tuple[dict, str, str, str | None]]:
    """Each quantized weight of a decoder's MatMulNBits (`decoder_stack_nodes`): the node's
    attributes and the names of its codes, scales and zero points (None without), a packed
    node's (inputs that `Concat` initializers, `onnx_passes.packed_projections`) one entry
    per packed weight."""
    concats = {n.output[0]: list(n.input) for n in graph.node if n.op_type == "Concat"}
    weights = []
    for node in decoder_stack_nodes(graph):
        if node.op_type != "MatMulNBits":
            continue
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        zero = node.input[3] if len(node.input) > 3 and node.input[3] else None
        parts = [concats.get(name, [name]) for name in (node.input[1], node.input[2])]
        zeros = concats.get(zero, [zero]) if zero is not None else [None] * len(parts[0])
        weights += [(attributes, codes, scales, z) for codes, scales, z in zip(parts[0], parts[1], zeros)]
    return weights


def dequantize_matmul_nbits(
    codes: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, bits: int, k: int
) -> np.ndarray:
    """W as [K, N] from MatMulNBits' B, scales and zero points (the contrib op's spec)."""
    n, blocks, _ = codes.shape
    if bits == 4:
        unpacked = np.stack([codes & 0x0F, codes >> 4], axis=-1).reshape(n, blocks, -1)
    else:
        unpacked = codes
    if zero_points is None:
        zero = np.full((n, blocks), 2 ** (bits - 1), dtype=np.float32)
    elif bits == 4:
        rows = zero_points.reshape(n, -1)
        zero = np.stack([rows & 0x0F, rows >> 4], axis=-1).reshape(n, -1)[:, :blocks].astype(np.float32)
    else:
        zero = zero_points.reshape(n, blocks).astype(np.float32)
    weight = (unpacked.astype(np.float32) - zero[..., None]) * scales.reshape(n, blocks)[..., None]
    return weight.reshape(n, -1)[:, :k].T


def check_saved_model(program: fx2onnx.ONNXProgram, path: Path, **save_kwargs: Any) -> Path:
    program.save(path, **save_kwargs)
    onnx.checker.check_model(os.fspath(path), full_check=True)
    return path


def _run_eager(model: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    with torch.no_grad():
        return model(*args, **kwargs)


def export_program(
    model: Any,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    options: fx2onnx.ExportOptions | None = None,
    tmp_path: Path | None = None,
) -> fx2onnx.ONNXProgram:
    if isinstance(model, torch.nn.Module):
        model.eval()
    options = options or make_options(tmp_path)
    try:
        program = fx2onnx.dynamo_export(model, *args, export_options=options, **dict(kwargs or {}))
    finally:
        if tmp_path is not None:
            validate_written_reports(tmp_path)
    return program


def assert_valid_model(program: fx2onnx.ONNXProgram) -> None:
    """The one validity assertion of every model the suite exports: the full ONNX checker
    (strict type and shape inference, functions included)."""
    onnx.checker.check_model(program.model_proto, full_check=True)


def export_and_compare_impl(
    model: Any,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    options: fx2onnx.ExportOptions | None = None,
    tmp_path: Path | None = None,
    second_inputs: tuple[Sequence[Any], Mapping[str, Any]] | None = None,
    *,
    eager: Callable[..., Any] | None = None,
    rtol: float = RTOL,
    atol: float = ATOL,
) -> fx2onnx.ONNXProgram:
    """Export `model`, save it, run the full ONNX checker on the file, run onnxruntime
    through `ONNXProgram.__call__` and compare with PyTorch eager (also on `second_inputs`,
    given as `(args, kwargs)`)."""
    kwargs = dict(kwargs or {})
    program = export_program(model, args, kwargs, options, tmp_path)
    assert tmp_path is not None
    check_saved_model(program, tmp_path / "m.onnx")
    eager = eager or model
    runs = [(tuple(args), kwargs)]
    if second_inputs is not None:
        runs.append((tuple(second_inputs[0]), dict(second_inputs[1])))
    for run_args, run_kwargs in runs:
        expected = _run_eager(eager, run_args, run_kwargs)
        actual = program(*run_args, **run_kwargs)
        assert_outputs_close(actual, expected, rtol=rtol, atol=atol)
    program.save_diagnostics(tmp_path / "export.sarif")
    validate_sarif(tmp_path / "export.sarif")
    return program


@pytest.fixture
def export_and_compare(tmp_path: Path) -> Callable[..., fx2onnx.ONNXProgram]:
    """`export_and_compare(model, args, kwargs=None, options=None, second_inputs=None)`."""

    def run(model: Any, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
            options: fx2onnx.ExportOptions | None = None, second_inputs: Any = None, **extra: Any) -> fx2onnx.ONNXProgram:
        return export_and_compare_impl(model, args, kwargs, options, tmp_path, second_inputs, **extra)

    return run


_unchecked_export = fx2onnx.dynamo_export


def checked_export(*args: Any, **kwargs: Any) -> fx2onnx.ONNXProgram:
    """`fx2onnx.dynamo_export` followed by the full checker on its model."""
    program = _unchecked_export(*args, **kwargs)
    assert_valid_model(program)
    return program


@pytest.fixture(autouse=True, scope="session")
def _every_export_is_valid() -> Iterator[None]:
    """Every model the suite exports through `fx2onnx.dynamo_export` passes the full
    checker, in a test or in a fixture of any scope: a session fixture is set up before
    the module and function fixtures that export."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fx2onnx, "dynamo_export", checked_export)
        yield


class MLP(torch.nn.Module):
    """A two-layer perceptron used by several end-to-end tests."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Apply(torch.nn.Module):
    """A module calling ``fn`` on its tensor inputs (one operator under test)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *tensors: torch.Tensor) -> Any:
        return self.fn(*tensors)


class TerminalStream(io.StringIO):
    """A stderr stand-in that says it is a terminal (progress bars show on terminals only)."""

    def isatty(self) -> bool:
        return True


def progress_counters(shown: str) -> list[tuple[int, int]]:
    """The `done/total` counters a progress bar wrote, in order."""
    parts = shown.replace("\r", "\n").split()
    return [tuple(int(n) for n in part.split("/")) for part in parts if re.fullmatch(r"\d+/\d+", part)]
