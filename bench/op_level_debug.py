"""Cost of op-level debugging on GPT-2 (12 layers): fx2onnx with and without
`ExportOptions(op_level_debug=True)`, and torch.onnx.export(dynamo=True), in one run.

Random weights (no download): the default GPT-2 configuration (12 layers, width 768)
unless --width / --layers say otherwise. Both granularities are measured: module
functions (one check per top-level module call) and a flat graph (one check per ATen
operator).

    python bench/op_level_debug.py                   # GPT-2 small shape, 12 layers
    python bench/op_level_debug.py --width 128       # quicker
"""

from __future__ import annotations

import argparse
import time
import warnings


def gpt2(layers: int, width: int):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=max(1, width // 64), use_cache=False)
    return transformers.GPT2LMHeadModel(config).eval(), (torch.randint(0, config.vocab_size, (1, 16)),)


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    arguments = parser.parse_args(argv)
    warnings.simplefilter("ignore")

    import torch

    import fx2onnx

    model, args = gpt2(arguments.layers, arguments.width)
    rows = []
    with torch.no_grad():
        seconds, _ = timed(lambda: torch.onnx.export(model, args, dynamo=True, verbose=False))
        rows.append(("torch.onnx.export(dynamo=True)", seconds, ""))
        for functions in (True, False):
            kind = "module functions" if functions else "flat graph"
            base, _ = timed(lambda: fx2onnx.dynamo_export(
                model, *args, export_options=fx2onnx.ExportOptions(module_functions=functions, failure_report_path=None)))
            rows.append((f"fx2onnx, {kind}", base, ""))
            debug, program = timed(lambda: fx2onnx.dynamo_export(
                model, *args, export_options=fx2onnx.ExportOptions(
                    module_functions=functions, op_level_debug=True, failure_report_path=None)))
            summary = next(d for d in program.diagnostics if d.rule.id == "FXE0013" and d.level.name == "NOTE")
            rows.append((f"fx2onnx, {kind}, op_level_debug", debug,
                         f"{debug / base:.2f}x export; debug stage {program.stage_seconds.get('op_level_debug', 0):.2f}s; "
                         f"{summary.message}"))
    print(f"GPT-2, {arguments.layers} layers, width {arguments.width}, sequence 16")
    reference = rows[0][1]
    for name, seconds, note in rows:
        print(f"  {name:48s} {seconds:8.2f} s  ({seconds / reference:.2f}x torch)  {note}")


if __name__ == "__main__":
    main()
