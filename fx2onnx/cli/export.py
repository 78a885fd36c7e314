"""`fx2onnx export`: the steps after the arguments were checked, through the public API.

Build the model and its example inputs, export, save the model and its report, optionally
verify it in onnxruntime against PyTorch, and print a summary. This module owns no export
logic: it calls what a Python user calls.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

import fx2onnx
from fx2onnx.cli.model import (
    bind_inputs, build_model, dynamic_shapes_spec, import_source, load_inputs_file, make_inputs, required_parameter_count,
    resolve_attribute,
)
from fx2onnx.cli.specs import DynamicSpec, InputSpec, ModelSpec, UsageError, make_example
from fx2onnx.capture import model_name
from fx2onnx.program import compare_outputs


@dataclass
class ExportRequest:
    """Everything `fx2onnx export` was asked to do, checked."""

    model: ModelSpec
    output: Path
    report: Path
    inputs: Sequence[InputSpec] = ()
    inputs_file: Path | None = None
    dynamic_all: bool = False
    dynamic: Sequence[DynamicSpec] = ()
    optimize: bool | None = None
    module_functions: bool = True
    verify: bool = False
    rtol: float = 1e-3
    atol: float = 1e-4
    fake: bool = False
    weights: Path | None = None
    opset: int | None = None
    runtime: str = "onnxruntime"
    precision: str | None = None
    target: str = "default"
    quiet: bool = False
    seed: int = 0
    lines: list[str] = field(default_factory=list)


def _export_options(request: ExportRequest, dynamic_shapes: Any, fake_context: Any) -> fx2onnx.ExportOptions:
    options: dict[str, Any] = {
        "dynamic_shapes": dynamic_shapes,
        "failure_report_path": request.report,
        "module_functions": request.module_functions,
        "runtime": request.runtime,
        "target": request.target,
    }
    if request.optimize is not None:
        options["optimize"] = request.optimize
    if fake_context is not None:
        options["fake_context"] = fake_context
    if request.opset is not None:
        options["opset_version"] = request.opset
    if request.precision is not None:
        options["precision"] = request.precision
    options["progress"] = not request.quiet  # a bar through the stages, drawn only when stderr is a terminal
    return fx2onnx.ExportOptions(**options)


def run_export(request: ExportRequest, say: Callable[[str], None]) -> int:
    """Export as asked; 0 when done (and verified), 1 when the export or verification failed."""
    module = import_source(request.model)
    target = resolve_attribute(module, request.model)
    fake_context_manager = fx2onnx.enable_fake_mode() if request.fake else contextlib.nullcontext()
    with fake_context_manager as fake_context:
        built = build_model(target, request.model)
        model = built.model
        if isinstance(model, torch.nn.Module):
            model.eval()
        args, kwargs = built.args, built.kwargs
        if request.inputs_file is not None:
            args, kwargs = load_inputs_file(request.inputs_file)
        elif request.inputs:
            generator = torch.Generator().manual_seed(request.seed)
            args, kwargs = make_inputs(request.inputs, generator)
        if not args and not kwargs and _needs_inputs(model):
            raise UsageError("give example inputs: --input name=2x16:float32 (one per parameter) or --inputs-file.")
    named = bind_inputs(model, args, kwargs)
    dynamic_shapes: Any = True if request.dynamic_all else None
    if request.dynamic:
        dynamic_shapes = dynamic_shapes_spec(request.dynamic, named)

    name = model_name(model)
    say(f"exporting {name} with inputs " + (", ".join(_describe_input(k, v) for k, v in _inputs_by_name(args, kwargs, named)) or "(none)"))
    options = _export_options(request, dynamic_shapes, fake_context)
    start = time.perf_counter()
    try:
        program = fx2onnx.dynamo_export(model, *args, export_options=options, **kwargs)
    except fx2onnx.OnnxExporterError as error:
        print(error, file=sys.stderr)  # the failure summary, with the report's path
        return 1
    _save(program, request, say)
    program.save_diagnostics(request.report)
    seconds = time.perf_counter() - start

    ok = True
    verification = None
    if request.verify:
        ok, verification = _verify(program, model, args, kwargs, named, request)
    for line in _summary(program, name, request, seconds):
        say(line)
    if verification is not None:
        say(verification)
    if not ok:
        print(f"verification failed: {verification}", file=sys.stderr)
    return 0 if ok else 1


def _save(program: fx2onnx.ONNXProgram, request: ExportRequest, say: Callable[[str], None]) -> None:
    if request.weights is not None:
        program.save(request.output, model_state=str(request.weights))
    elif request.fake:
        # Built in fake mode, the model has no weight data to write: the graph only.
        program.save(request.output, include_initializers=False)
        say(f"note: {request.output} holds no weights (fake mode); give them with --weights CHECKPOINT")
    else:
        program.save(request.output)


def _needs_inputs(model: Any) -> bool:
    target = model.forward if isinstance(model, torch.nn.Module) else model
    return required_parameter_count(target) > 0


def _inputs_by_name(args: tuple[Any, ...], kwargs: dict[str, Any], named: dict[str, Any]) -> list[tuple[str, Any]]:
    if named:
        return list(named.items())
    return [(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())


def _describe_input(name: str, value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{name} {str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    return f"{name}={type(value).__name__}"


def _describe_value(value: Any) -> str:  # an onnx_ir value
    dims = ", ".join(str(d) for d in value.shape) if value.shape is not None else "?"
    dtype = value.dtype.name if value.dtype is not None else "?"
    return f"{value.name} {dtype}[{dims}]"


def _summary(program: fx2onnx.ONNXProgram, name: str, request: ExportRequest, seconds: float) -> list[str]:
    model = program.model
    graph = model.graph
    size = request.output.stat().st_size
    data = request.output.with_name(request.output.name + ".data")
    where = f"{request.output} ({_size(size)}" + (f", weights in {data.name} {_size(data.stat().st_size)}" if data.exists() else "") + ")"
    stages = ", ".join(f"{k} {v:.2f}s" for k, v in program.stage_seconds.items())
    warnings = program.diagnostic_context.warnings()
    lines = [
        f"exported {name} to {where} in {seconds:.1f} s",
        "inputs:  " + (", ".join(_describe_value(v) for v in graph.inputs) or "(none)"),
        "outputs: " + ", ".join(_describe_value(v) for v in graph.outputs),
        f"nodes: {len(graph)}, initializers: {len(graph.initializers)}, functions: {len(model.functions)}",
        f"stages: {stages}",
        f"warnings: {len(warnings)}",
    ]
    lines += [f"  - [{w.rule.id}] {w.message.strip().splitlines()[0]}" for w in warnings]
    lines.append(f"report: {request.report}")
    return lines


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.0f} KiB"


# -- verification ----------------------------------------------------------------------------


def _verify(
    program: fx2onnx.ONNXProgram, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
    named: dict[str, Any], request: ExportRequest,
) -> tuple[bool, str]:
    """Run onnxruntime and PyTorch on the example inputs (and, with dynamic dims, at other
    sizes); the largest difference and whether every output is within tolerance."""
    runs = [(args, kwargs)]
    other = _inputs_at_other_sizes(program, named, request)
    if other is not None:
        runs.append(other)
    worst, ok, sizes = 0.0, True, []
    for run_args, run_kwargs in runs:
        with torch.no_grad():
            expected = model(*run_args, **run_kwargs)
        try:
            actual = program(*run_args, **run_kwargs)
        except Exception as error:  # noqa: BLE001 - onnxruntime's failure is the verdict
            return False, f"verification: FAIL, onnxruntime failed on inputs {_shapes(run_args, run_kwargs)}: {error}"
        difference, close = compare_outputs(actual, expected, request.rtol, request.atol)
        worst, ok = max(worst, difference), ok and close
        sizes.append(_shapes(run_args, run_kwargs))
    verdict = "PASS" if ok else "FAIL"
    return ok, (
        f"verification: {verdict}, max abs difference vs PyTorch {worst:.3g} (onnxruntime, "
        f"inputs {' and '.join(sizes)}; rtol {request.rtol:g}, atol {request.atol:g})"
    )


def _shapes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    leaves = pytree.tree_leaves((args, kwargs))
    return " ".join(str(list(t.shape)) for t in leaves if isinstance(t, torch.Tensor))


def _inputs_at_other_sizes(
    program: fx2onnx.ONNXProgram, named: dict[str, Any], request: ExportRequest
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The example inputs again with every dynamic dim of the ONNX model one larger (dims
    that share a symbol stay equal); None when the inputs were not made from shapes or
    no dim is dynamic."""
    if not request.inputs or request.inputs_file is not None or not named:
        return None
    symbolic: dict[str, dict[int, str]] = {}
    for value in program.model.graph.inputs:
        if value.name in named and value.shape is not None:
            dims = {i: str(d) for i, d in enumerate(value.shape) if not isinstance(d, int)}
            if dims:
                symbolic[value.name] = dims
    if not symbolic:
        return None
    positional = [s for s in request.inputs if s.name is None]
    specs_by_name = {s.name: s for s in request.inputs if s.name is not None}
    names = list(named)
    for index, spec in enumerate(positional):  # positional inputs take the first parameters' names
        specs_by_name.setdefault(names[index], spec)
    generator = torch.Generator().manual_seed(request.seed + 1)
    new_inputs: dict[str, torch.Tensor] = {}
    for name, spec in specs_by_name.items():
        shape = list(spec.shape)
        for index in symbolic.get(name, {}):
            shape[index] += 1
        new_inputs[name] = make_example(spec, tuple(shape), generator)
    args = tuple(new_inputs[names[i]] for i in range(len(positional)))
    kwargs = {n: v for n, v in new_inputs.items() if n not in names[: len(positional)]}
    return args, kwargs


__all__ = ["ExportRequest", "run_export"]
