"""Command line: `python -m fx2onnx demo` exports the built-in example and checks it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch


def _run_demo(output: Path, report: Path, dynamic: bool) -> int:
    import fx2onnx
    from fx2onnx.demo import demo_model_and_inputs

    model, inputs = demo_model_and_inputs()
    options = fx2onnx.ExportOptions(dynamic_shapes=dynamic, failure_report_path=report)
    try:
        program = fx2onnx.dynamo_export(model, *inputs, export_options=options)
    except fx2onnx.OnnxExporterError as error:
        print(error, file=sys.stderr)
        return 1
    program.save(output)
    program.save_diagnostics(report)

    checks = [inputs]
    if dynamic:  # the exported model must also be right at another batch and length
        checks.append((torch.randint(0, 100, (3, 11)),))
    error = 0.0
    ok = True
    for check in checks:
        with torch.no_grad():
            expected = model(*check)
        actual = program(*check)
        error = max(error, (actual - expected).abs().max().item())
        ok = ok and torch.allclose(actual, expected, rtol=1e-3, atol=1e-4)
    graph = program.model.graph
    print(f"exported {type(model).__name__} to {output} ({output.stat().st_size / 1024:.0f} KiB)")
    print("inputs:  " + ", ".join(_describe(v) for v in graph.inputs))
    print("outputs: " + ", ".join(_describe(v) for v in graph.outputs))
    print(f"nodes: {len(graph)}, initializers: {len(graph.initializers)}, functions: {len(program.model.functions)}")
    sizes = " and ".join(str(list(check[0].shape)) for check in checks)
    print(f"max abs error vs PyTorch (onnxruntime, inputs {sizes}): {error:.3g}")
    print(f"diagnostics: {report}")
    print("verification: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


def _describe(value) -> str:  # noqa: ANN001 - an onnx_ir value
    dims = ", ".join(str(d) for d in value.shape)
    return f"{value.name} {value.dtype.name}[{dims}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fx2onnx", description="Export PyTorch models to ONNX.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="export the built-in transformer, verify it in onnxruntime")
    demo.add_argument("--output", type=Path, default=Path("demo.onnx"))
    demo.add_argument("--report", type=Path, default=Path("demo.sarif"))
    demo.add_argument("--dynamic", action="store_true", help="export with dynamic batch and sequence dims")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _run_demo(args.output, args.report, args.dynamic)
    return 2


if __name__ == "__main__":
    sys.exit(main())
