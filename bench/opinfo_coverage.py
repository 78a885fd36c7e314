"""Operator coverage on PyTorch's OpInfo database: fx2onnx next to torch.onnx.export(dynamo=True).

For every OpInfo operator that supports the dtype on CPU, up to three sample inputs are
wrapped as modules, exported by both exporters in the same run, executed in onnxruntime
and compared with eager PyTorch (one tolerance for both; NaNs equal; dtypes compared
apart). Random operators are skipped; `empty*` operators are compared by shape only.

    python bench/opinfo_coverage.py --dtype float32 --jobs 2 --json opinfo_float32.json
    python bench/opinfo_coverage.py --dtype complex64 --ops add,mul,abs
    python bench/opinfo_coverage.py --report opinfo_float32.json   # print a saved run again
    python bench/opinfo_coverage.py --rerun-failing opinfo_float32.json --json after.json

Printed per exporter: operators fully passing (every sample), samples passing, failures
by category (export, onnxruntime, mismatch, timeout), dtype mismatches; then the
operators where the exporters disagree, and fx2onnx's export failures grouped by the
rule and first line of their first error diagnostic. An fx2onnx export failure without
an error diagnostic is a bug: their count is printed.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import queue
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import opinfo_harness as harness  # noqa: E402

CATEGORIES = ("export", "onnxruntime", "mismatch", "timeout")


def _dtype(name: str):
    import torch

    return getattr(torch, name)


# -- workers ---------------------------------------------------------------------------------


def _worker(tasks: Any, results: Any, worker_id: int, dtype_name: str, limit: int, seconds: float) -> None:
    harness.quiet()
    dtype = _dtype(dtype_name)
    by_name = {harness.opinfo_name(o): o for o in harness.op_infos(dtype)}
    while True:
        try:
            name = tasks.get(timeout=1)
        except queue.Empty:
            continue
        if name is None:
            results.put(("done", worker_id, None))
            return
        results.put(("start", worker_id, name))
        result = harness.run_op(by_name[name], dtype, limit=limit, seconds=seconds)
        results.put(("result", worker_id, result.to_json()))


def run_all(names: list[str], dtype_name: str, jobs: int, limit: int, seconds: float, op_seconds: float, log: Any) -> list[harness.OpResult]:
    context = multiprocessing.get_context("spawn")
    tasks = context.Queue()
    results = context.Queue()
    for name in names:
        tasks.put(name)
    workers: dict[int, Any] = {}
    current: dict[int, tuple[str, float]] = {}

    def start(worker_id: int) -> None:
        process = context.Process(target=_worker, args=(tasks, results, worker_id, dtype_name, limit, seconds), daemon=True)
        process.start()
        workers[worker_id] = process

    for worker_id in range(jobs):
        start(worker_id)
    done: list[harness.OpResult] = []
    finished_workers = 0
    begin = time.time()
    while len(done) < len(names):
        try:
            kind, worker_id, payload = results.get(timeout=2)
        except queue.Empty:
            kind = None
        if kind == "start":
            current[worker_id] = (payload, time.time())
        elif kind == "result":
            result = harness.OpResult.from_json(payload)
            current.pop(worker_id, None)
            done.append(result)
            _log_op(log, len(done), len(names), result, time.time() - begin)
        elif kind == "done":
            finished_workers += 1
        for worker_id, process in list(workers.items()):
            if worker_id not in current and not process.is_alive() and len(done) < len(names):
                if time.time() - begin > 60 and process.exitcode not in (0, None):
                    print(f"worker {worker_id} exited with code {process.exitcode}; restarting it", file=log, flush=True)
                start(worker_id)  # died between operators (e.g. at start-up)
        for worker_id, (name, started) in list(current.items()):
            process = workers[worker_id]
            if time.time() - started > op_seconds or not process.is_alive():
                why = "timeout" if process.is_alive() else f"worker died (exit code {process.exitcode})"
                process.kill()
                process.join()
                current.pop(worker_id)
                result = harness.OpResult(name)
                for exporter in harness.EXPORTERS:
                    result.results[exporter] = [harness.SampleResult("timeout", f"operator: {why}")]
                done.append(result)
                _log_op(log, len(done), len(names), result, time.time() - begin)
                start(worker_id)
    for _ in workers:
        tasks.put(None)
    for process in workers.values():
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
    return done


def _log_op(log: Any, index: int, total: int, result: harness.OpResult, elapsed: float) -> None:
    if result.skipped:
        state = f"skipped ({result.skipped})"
    else:
        state = "  ".join(
            f"{exporter}: " + "".join("." if s.passed else s.status[0].upper() for s in samples)
            for exporter, samples in result.results.items()
        )
    print(f"[{index}/{total} {elapsed:6.0f}s] {result.name}: {state}", file=log, flush=True)


# -- the report ---------------------------------------------------------------------------------


def summarize(results: list[harness.OpResult]) -> dict[str, Any]:
    tested = [r for r in results if not r.skipped]
    summary: dict[str, Any] = {"operators": len(results), "tested": len(tested), "skipped": len(results) - len(tested)}
    for exporter in harness.EXPORTERS:
        samples = [s for r in tested for s in r.results.get(exporter, []) if s.status != "eager"]
        failures = collections.Counter(s.status for s in samples if not s.passed)
        summary[exporter] = {
            "operators_passing": sum(r.passed(exporter) for r in tested),
            "samples": len(samples),
            "samples_passing": sum(s.passed for s in samples),
            "failures": {c: failures.get(c, 0) for c in CATEGORIES},
            "dtype_mismatches": sum(s.dtype_mismatch for s in samples),
        }
    fx = [s for r in tested for s in r.results.get("fx2onnx", []) if s.status == "export"]
    summary["fx2onnx"]["export_failures_without_diagnostic"] = sum(not s.rule for s in fx)
    summary["only_torch_passes"] = sorted(r.name for r in tested if r.passed("torch") and not r.passed("fx2onnx"))
    summary["only_fx2onnx_passes"] = sorted(r.name for r in tested if r.passed("fx2onnx") and not r.passed("torch"))
    return summary


def _first_failure(samples: list[harness.SampleResult]) -> harness.SampleResult | None:
    return next((s for s in samples if not s.passed and s.status != "eager"), None)


def print_report(results: list[harness.OpResult], dtype_name: str, out: Any = sys.stdout) -> dict[str, Any]:
    summary = summarize(results)
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"\nOpInfo coverage, dtype {dtype_name}: {summary['tested']} operators tested "
      f"({summary['skipped']} skipped: random or no samples)\n")
    header = f"{'exporter':<10} {'ops passing':>12} {'samples passing':>16} {'export':>7} {'onnxruntime':>12} {'mismatch':>9} {'timeout':>8} {'dtype≠':>7}"
    p(header)
    p("-" * len(header))
    for exporter in harness.EXPORTERS:
        s = summary[exporter]
        f = s["failures"]
        p(f"{exporter:<10} {s['operators_passing']:>5}/{summary['tested']:<6} {s['samples_passing']:>8}/{s['samples']:<7} "
          f"{f['export']:>7} {f['onnxruntime']:>12} {f['mismatch']:>9} {f['timeout']:>8} {s['dtype_mismatches']:>7}")
    p(f"\nfx2onnx export failures without an error diagnostic: {summary['fx2onnx']['export_failures_without_diagnostic']}")

    by_name = {r.name: r for r in results}
    p(f"\nOperators only torch.onnx.export passes ({len(summary['only_torch_passes'])}):")
    for name in summary["only_torch_passes"]:
        failure = _first_failure(by_name[name].results["fx2onnx"])
        if failure is not None:
            p(f"  {name:<40} {failure.status:<12} {failure.rule + ' ' if failure.rule else ''}{failure.reason[:150]}")
    p(f"\nOperators only fx2onnx passes ({len(summary['only_fx2onnx_passes'])}):")
    for name in summary["only_fx2onnx_passes"]:
        failure = _first_failure(by_name[name].results["torch"])
        if failure is not None:
            p(f"  {name:<40} {failure.status:<12} {failure.reason[:150]}")

    causes: collections.Counter = collections.Counter()
    operators: dict[str, set[str]] = collections.defaultdict(set)
    for result in results:
        for sample in result.results.get("fx2onnx", []):
            if sample.passed or sample.status == "eager":
                continue
            key = f"{sample.status}: {sample.rule + ' ' if sample.rule else ''}{_cause(sample.reason)}"
            causes[key] += 1
            operators[key].add(result.name)
    p("\nfx2onnx failure causes (samples, operators):")
    for key, count in sorted(causes.items(), key=lambda kv: -len(operators[kv[0]]))[:40]:
        names = sorted(operators[key])
        p(f"  {count:>4} {len(names):>4}  {key[:160]}  [{', '.join(names[:6])}{', ...' if len(names) > 6 else ''}]")
    return summary


def _cause(reason: str) -> str:
    """A failure reason without the node names and numbers that differ per operator."""
    import re

    text = re.sub(r"FX node '[^']*'( at [^:]*:\d+( \([^)]*\))?)?", "FX node", reason)
    text = re.sub(r"'(val|[a-z_]+)_\d+'", "'…'", text)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    return text[:140]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32", choices=["float32", "complex64", "float16", "int64", "bool", "float64"])
    parser.add_argument("--ops", default="", help="comma-separated OpInfo names (name or name.variant)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N operators")
    parser.add_argument("--samples", type=int, default=harness.SAMPLES_PER_OP, help="samples per operator")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (spawned)")
    parser.add_argument("--sample-seconds", type=float, default=60, help="time limit of one export+run")
    parser.add_argument("--op-seconds", type=float, default=400, help="time limit of one operator (the worker is killed)")
    parser.add_argument("--json", default="", help="save per-sample results and the summary here")
    parser.add_argument("--report", default="", help="print the report of a saved --json file and exit")
    parser.add_argument("--rerun-failing", default="", help="a saved --json run: run again (both exporters) "
                        "only the operators fx2onnx did not fully pass, and report the merged results")
    parser.add_argument("--log", default="", help="per-operator progress goes here (default: stderr)")
    args = parser.parse_args(argv)

    if args.report:
        with open(args.report) as f:
            data = json.load(f)
        print_report([harness.OpResult.from_json(r) for r in data["results"]], data["dtype"])
        return 0

    harness.quiet()
    dtype = _dtype(args.dtype)
    names = [harness.opinfo_name(o) for o in harness.op_infos(dtype, [n for n in args.ops.split(",") if n] or None)]
    if args.limit:
        names = names[: args.limit]
    base: list[harness.OpResult] = []
    if args.rerun_failing:
        with open(args.rerun_failing) as f:
            base = [harness.OpResult.from_json(r) for r in json.load(f)["results"]]
        failing = {r.name for r in base if not r.skipped and not r.passed("fx2onnx")}
        names = [n for n in names if n in failing]
    log = open(args.log, "a") if args.log else sys.stderr
    start = time.time()
    results = run_all(names, args.dtype, max(1, args.jobs), args.samples, args.sample_seconds, args.op_seconds, log)
    if base:
        rerun = {r.name: r for r in results}
        results = [rerun.get(r.name, r) for r in base]
    else:
        order = {name: i for i, name in enumerate(names)}
        results.sort(key=lambda r: order.get(r.name, 0))
    summary = print_report(results, args.dtype)
    print(f"\n{len(names)} operators in {time.time() - start:.0f} s with {args.jobs} job(s).")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"dtype": args.dtype, "summary": summary, "results": [r.to_json() for r in results]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
