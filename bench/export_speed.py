"""Export speed and memory: fx2onnx side by side with torch.onnx.export(dynamo=True).

Each (model, exporter) pair runs in a fresh subprocess, so that the peak RSS of one
export is not hidden by what an earlier export already loaded. Inside the subprocess the
model is built, one untimed warm-up export runs (imports, torch.export caches), then
``--repeat`` timed exports. Printed per model and exporter: median wall time, peak
Python allocations (tracemalloc, last repetition), RSS growth over the process before
the first export, and the ratio fx2onnx / torch; then fx2onnx's per-stage times
(``ONNXProgram.stage_seconds``).

    python bench/export_speed.py                 # all models, 3 repetitions
    python bench/export_speed.py --models mlp --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
import warnings

MODELS = ("mlp", "demo", "gpt2")
EXPORTERS = ("fx2onnx", "torch")


def build(name: str):
    """(model, args) for a benchmark model name."""
    import torch

    torch.manual_seed(0)
    if name == "mlp":
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 10)
        )
        return model.eval(), (torch.randn(8, 64),)
    if name == "demo":
        import fx2onnx.demo

        model, args = fx2onnx.demo.demo_model_and_inputs()
        return model.eval(), tuple(args)
    if name == "gpt2":
        import transformers

        config = transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=1000, n_positions=64, use_cache=False
        )
        return transformers.GPT2LMHeadModel(config).eval(), (torch.randint(0, 1000, (1, 8)),)
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


def export_once(exporter: str, model, args) -> dict[str, float]:
    """Export once; returns fx2onnx's stage times (empty for torch)."""
    if exporter == "fx2onnx":
        import fx2onnx

        program = fx2onnx.dynamo_export(model, *args)
        program.model_proto  # serialization is part of the work a user waits for
        return dict(program.stage_seconds)
    import torch

    program = torch.onnx.export(model, args, dynamo=True, verbose=False)
    program.model_proto
    return {}


def _rss_bytes() -> int:
    """Peak resident set size of this process so far (ru_maxrss is KiB on Linux)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def measure(model_name: str, exporter: str, repeat: int) -> dict:
    """Runs inside the subprocess: warm-up, then timed repetitions."""
    warnings.simplefilter("ignore")
    import logging

    logging.disable(logging.WARNING)
    model, args = build(model_name)
    rss_before = _rss_bytes()
    export_once(exporter, model, args)  # warm-up: imports and caches
    rss_after_first = _rss_bytes()
    times, stages = [], []
    tracemalloc.start()
    for index in range(repeat):
        if index == repeat - 1:
            tracemalloc.reset_peak()
        start = time.perf_counter()
        stages.append(export_once(exporter, model, args))
        times.append(time.perf_counter() - start)
    _, peak_alloc = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    stage_median = {key: statistics.median(s[key] for s in stages if key in s) for key in (stages[0] if stages else {})}
    return {
        "model": model_name,
        "exporter": exporter,
        "seconds": times,
        "first_export_rss_mib": (rss_after_first - rss_before) / 2**20,
        "peak_rss_mib": _rss_bytes() / 2**20,
        "peak_alloc_mib": peak_alloc / 2**20,
        "stages": stage_median,
    }


def run_in_subprocess(model_name: str, exporter: str, repeat: int) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--child", model_name, exporter, "--repeat", str(repeat)]
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        return {"model": model_name, "exporter": exporter, "error": completed.stderr.strip().splitlines()[-1:]}
    return json.loads(completed.stdout.strip().splitlines()[-1])


def print_table(results: list[dict]) -> None:
    header = f"{'model':<6} {'exporter':<8} {'median s':>9} {'min s':>7} {'peak alloc MiB':>15} {'1st-export RSS MiB':>19} {'peak RSS MiB':>13}"
    print(header)
    print("-" * len(header))
    by_key = {(r["model"], r["exporter"]): r for r in results}
    for result in results:
        if "error" in result:
            print(f"{result['model']:<6} {result['exporter']:<8} FAILED: {result['error']}")
            continue
        print(
            f"{result['model']:<6} {result['exporter']:<8} {statistics.median(result['seconds']):>9.3f} "
            f"{min(result['seconds']):>7.3f} {result['peak_alloc_mib']:>15.1f} "
            f"{result['first_export_rss_mib']:>19.1f} {result['peak_rss_mib']:>13.1f}"
        )
    print()
    print("ratio fx2onnx / torch (median time, peak alloc, 1st-export RSS):")
    for model in dict.fromkeys(r["model"] for r in results):
        ours, theirs = by_key.get((model, "fx2onnx")), by_key.get((model, "torch"))
        if not ours or not theirs or "error" in ours or "error" in theirs:
            continue
        time_ratio = statistics.median(ours["seconds"]) / statistics.median(theirs["seconds"])
        alloc_ratio = ours["peak_alloc_mib"] / max(theirs["peak_alloc_mib"], 1e-9)
        rss_ratio = ours["first_export_rss_mib"] / max(theirs["first_export_rss_mib"], 1e-9)
        print(f"  {model:<6} time x{time_ratio:.2f}   alloc x{alloc_ratio:.2f}   rss x{rss_ratio:.2f}")
    print()
    print("fx2onnx stage times (median seconds):")
    for result in results:
        if result.get("exporter") == "fx2onnx" and "stages" in result:
            stages = ", ".join(f"{k} {v:.3f}" for k, v in result["stages"].items())
            print(f"  {result['model']:<6} {stages}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--exporters", nargs="+", default=list(EXPORTERS), choices=EXPORTERS)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="also write the raw results to this file")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "EXPORTER"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        print(json.dumps(measure(*options.child, options.repeat)))
        return
    results = []
    for model in options.models:
        for exporter in options.exporters:
            print(f"... {model} with {exporter}", file=sys.stderr, flush=True)
            results.append(run_in_subprocess(model, exporter, options.repeat))
    print(f"torch {_version('torch')}, fx2onnx {_version('fx2onnx')}, {options.repeat} timed repetitions after 1 warm-up")
    print_table(results)
    if options.json:
        with open(options.json, "w", encoding="utf-8") as stream:
            json.dump(results, stream, indent=2)


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    main()
