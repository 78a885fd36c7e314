"""Where one int4 decode step spends its time: onnxruntime's profiler on the decoder of
`export-hf --precision int4` against ONNX Runtime GenAI's model builder's ``-p int4 -e cpu``
folder of the same weights (`runtime_speed.py`'s LLaMA-style 4 x 512, vocab 32000).

Each folder's decoder runs in an onnxruntime session (the folder's file, intra-op threads
as given) on one new token over a cache of ``--past`` positions; the step is repeated
``--steps`` times, the folders interleaved, and the profiler's node events are summed by
operator type: time per step, node count, share of the step. The graphs' operator counts
name the structural differences (packed projections, fused normalizations, the logits).
Each step's CPU time on the calling thread (where onnxruntime runs with one intra-op
thread) is compared step by step with the builder's: a ratio a loaded machine moves less
than the wall clock.

    flock /tmp/fx2onnx-heavy.lock python bench/int4_decode_profile.py [--past 128] [--steps 20] [--threads 2] \\
        [--markdown out.md] [--keep DIR] [--contenders fx2onnx-int4 fx2onnx-int4-packed builder-int4] [--node-medians]
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from precision_folders import export_contender
from runtime_speed import _write_llm

CONTENDERS = ("fx2onnx-int4", "builder-int4")


def _decoder(folder: Path) -> tuple[Path, dict[str, Any]]:
    decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
    return folder / decoder["filename"], decoder


def step_feeds(session: Any, decoder: dict[str, Any], past: int, new: int = 1) -> dict[str, np.ndarray]:
    """``new`` tokens after ``past`` cached ones (a random cache, every position held)."""
    names = {**decoder.get("inputs", {})}
    given = {
        names.get("input_ids", "input_ids"): np.arange(5, 5 + new)[None] % 300,
        names.get("attention_mask", "attention_mask"): np.ones((1, past + new)),
        names.get("position_ids", "position_ids"): np.arange(past, past + new)[None],
    }
    types = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32, "tensor(float16)": np.float16}
    generator = np.random.default_rng(0)
    result = {}
    for arg in session.get_inputs():
        kind = types[arg.type]
        if arg.name in given:
            result[arg.name] = given[arg.name].astype(kind)
        else:  # a past key or value: [1, kv heads, past, head size]
            shape = (1, decoder["num_key_value_heads"], past, decoder["head_size"])
            result[arg.name] = generator.standard_normal(shape).astype(kind)
    return result


def _summed_node_medians(nodes: list[dict[str, Any]], first: float, measured: int) -> dict[str, list[float]]:
    """By operator type: the sum of its nodes' median times per step, times ``measured``
    (the totals the profile divides by the steps), and its node count times ``measured``."""
    durations: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for event in nodes:
        if event["ts"] >= first:
            durations[event["args"]["op_name"], event["name"]].append(event["dur"])
    by_type: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for (op, _), times in durations.items():
        by_type[op][0] += float(np.median(times)) * measured
        by_type[op][1] += measured
    return by_type


def profile(folders: dict[str, Path], past: int, steps: int, threads: int, scratch: Path,
            node_medians: bool = False) -> dict[str, Any]:
    import onnxruntime

    sessions, feeds = {}, {}
    for name, folder in folders.items():
        path, decoder = _decoder(folder)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.enable_profiling = True
        options.profile_file_prefix = str(scratch / name)
        sessions[name] = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        feeds[name] = step_feeds(sessions[name], decoder, past)
        sessions[name].run(None, feeds[name])  # warm up (its events are dropped below)
    # the calling thread's CPU time per step: onnxruntime runs on it with one intra-op thread,
    # so other jobs on a shared machine inflate it far less than the wall clock
    cpu: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(steps):
        for name, session in sessions.items():
            started = time.thread_time()
            session.run(None, feeds[name])
            cpu[name].append(time.thread_time() - started)
    reference = list(sessions)[-1]
    results = {}
    for name, session in sessions.items():
        events = json.loads(Path(session.end_profiling()).read_text())
        results[name] = {**summarize_profile(events, warmup_runs=1, node_medians=node_medians),
                         "cpu_us": float(np.median(cpu[name])) * 1e6,
                         "cpu_ratio": float(np.median(np.array(cpu[name]) / np.array(cpu[reference])))}
    return results


def summarize_profile(events: list[dict[str, Any]], warmup_runs: int, node_medians: bool = False) -> dict[str, Any]:
    """onnxruntime profiler ``events`` of one session after its first ``warmup_runs`` runs:
    the median step (µs), per operator type its µs per step and nodes, the slowest nodes.
    With ``node_medians``, each node's median over the steps summed by type (robust to
    other jobs' preemptions) instead of its mean."""
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    first = runs[warmup_runs]["ts"] if len(runs) > warmup_runs else 0
    by_type: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    by_node: dict[str, float] = collections.defaultdict(float)
    for event in nodes:
        if event["ts"] < first:
            continue
        entry = by_type[event["args"]["op_name"]]
        entry[0] += event["dur"]
        entry[1] += 1
        by_node[event["name"].removesuffix("_kernel_time")] += event["dur"]
    measured = max(len(runs) - warmup_runs, 1)
    if node_medians:
        by_type = _summed_node_medians(nodes, first, measured)
    slowest = sorted(by_node.items(), key=lambda item: -item[1])[:8]
    return {"step_us": float(np.median([r["dur"] for r in runs[warmup_runs:]])),
            "ops": {op: (total / measured, count // measured) for op, (total, count) in by_type.items()},
            "slowest_nodes": [(node, total / measured) for node, total in slowest]}


def markdown(results: dict[str, Any]) -> str:
    names = list(results)
    lines = ["| operator | " + " | ".join(f"{n} µs/step (nodes)" for n in names) + " |",
             "|---|" + "---:|" * len(names)]
    ops = sorted({op for r in results.values() for op in r["ops"]},
                 key=lambda op: -max(r["ops"].get(op, (0, 0))[0] for r in results.values()))
    for op in ops:
        cells = []
        for name in names:
            time_us, count = results[name]["ops"].get(op, (0.0, 0))
            cells.append(f"{time_us:.0f} ({count})" if count else "-")
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    lines.append("| **step (median model_run)** | " + " | ".join(f"**{results[n]['step_us']:.0f}**" for n in names) + " |")
    lines.append(f"| **step, thread CPU time (median; per-step ratio to {names[-1]})** | "
                 + " | ".join(f"**{results[n]['cpu_us']:.0f} ({results[n]['cpu_ratio']:.3f}x)**" for n in names) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--past", type=int, default=128, help="cached positions before the step")
    parser.add_argument("--steps", type=int, default=20, help="profiled steps per folder (interleaved)")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime's intra-op threads")
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--keep", type=Path, help="write the source model and the folders here")
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS),
                        help="folders under --keep (written when missing: precision_folders.py's names); the last is the reference")
    parser.add_argument("--node-medians", action="store_true",
                        help="sum each node's median time per step (robust on a loaded machine) instead of its mean")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch_name:
        root = args.keep or Path(scratch_name)
        source = root / "source"
        if not (source / "config.json").exists():
            _write_llm("llama", source)
        folders = {}
        for name in args.contenders:
            folders[name] = root / name
            if not (folders[name] / "genai_config.json").exists():
                export_contender(name, source, folders[name])
        results = profile(folders, args.past, args.steps, args.threads, Path(scratch_name), args.node_medians)
    table = markdown(results)
    print(table)
    for name, result in results.items():
        print(f"{name} slowest nodes (µs/step): " + ", ".join(f"{n} {t:.0f}" for n, t in result["slowest_nodes"]))
    if args.markdown:
        args.markdown.write_text(table + "\n")


if __name__ == "__main__":
    main()
