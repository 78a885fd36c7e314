"""Thread CPU time of one prefill and one decode step: fx2onnx's causal-LM folders against
ONNX Runtime GenAI's model builder's (`runtime_speed.py`'s LLaMA- and Qwen2-style 4 x 512,
vocab 32000), float32 and int4.

Each folder's decoder runs in an onnxruntime session with one intra-op thread, so that the
step runs on the calling thread and its CPU time (``time.thread_time``) is the step's work:
other jobs on a shared machine inflate it far less than the wall clock. Per length
(``--lengths``), a prefill is a prompt of that many tokens over an empty cache, a decode
step one token over a cache of that many positions (random, all held). Rounds are
interleaved (every contender ``--repeats`` times in a row per round and phase, in a
rotated order, the least of those counting: other jobs only ever add time); the ratio is
the median over rounds of fx2onnx's time over the builder's of the same precision in that
round. The wall time per step is given beside it.

    OMP_NUM_THREADS=1 nice -n 10 python bench/step_cpu_time.py [--models llama qwen2] [--rounds 9] \\
        [--repeats 3] [--phases prefill decode] [--lengths 128 1024] [--load-orders given reversed] \\
        [--work DIR] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


sys.path.insert(0, str(Path(__file__).parent))
from int4_decode_profile import _decoder, step_feeds  # noqa: E402 - bench modules side by side
from precision_folders import export_contender  # noqa: E402
from runtime_speed import _llm_config, write_llm_folder  # noqa: E402

CONTENDERS = ("fx2onnx-fp32", "builder-fp32", "fx2onnx-int4", "builder-int4")
PHASES = ("prefill", "decode")


def _session(path: Path, threads: int) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def measure(folders: dict[str, Path], lengths: list[int], rounds: int, threads: int,
            repeats: int = 3, phases: tuple[str, ...] = PHASES,
            load_reversed: bool = False) -> dict[tuple[str, int], dict[str, Any]]:
    """By (phase, length): each contender's median thread CPU and wall ms per step, and
    the median per-round ratio to the builder of its precision. The sessions are created
    in the contenders' order, or in the reverse order with ``load_reversed``: where a
    session's weights land in memory moves its one-row products by as much as the
    folders differ (two sessions of one folder in one process), so a fair comparison
    reads both orders."""
    sessions, steps = {}, {}
    for name in (reversed(list(folders)) if load_reversed else list(folders)):
        folder = folders[name]
        path, decoder = _decoder(folder)
        sessions[name] = _session(path, threads)
        for length in lengths:
            steps["prefill", length, name] = step_feeds(sessions[name], decoder, 0, length)
            steps["decode", length, name] = step_feeds(sessions[name], decoder, length, 1)
    for (_, _, name), feed in steps.items():  # warm-up
        sessions[name].run(None, feed)
    cpu: dict[tuple[str, int, str], list[float]] = collections.defaultdict(list)
    wall: dict[tuple[str, int, str], list[float]] = collections.defaultdict(list)
    names = list(folders)
    for round_index in range(rounds):
        order = names[round_index % len(names):] + names[:round_index % len(names)]
        for phase in phases:
            for length in lengths:
                for name in order:
                    times = []
                    for _ in range(repeats):
                        started, started_wall = time.thread_time(), time.perf_counter()
                        sessions[name].run(None, steps[phase, length, name])
                        times.append(((time.thread_time() - started) * 1e3, (time.perf_counter() - started_wall) * 1e3))
                    # the least of the round's repeats: other jobs only ever add time
                    cpu[phase, length, name].append(min(c for c, _ in times))
                    wall[phase, length, name].append(min(w for _, w in times))
    results: dict[tuple[str, int], dict[str, Any]] = {}
    for phase in phases:
        for length in lengths:
            entry = {}
            for name in names:
                builder = f"builder-{name.split('-')[1]}"
                ratios = [a / b for a, b in zip(cpu[phase, length, name], cpu[phase, length, builder])]
                wall_ratios = [a / b for a, b in zip(wall[phase, length, name], wall[phase, length, builder])]
                entry[name] = {"cpu_ms": statistics.median(cpu[phase, length, name]),
                               "wall_ms": statistics.median(wall[phase, length, name]),
                               "cpu_ratio": statistics.median(ratios), "wall_ratio": statistics.median(wall_ratios)}
            results[phase, length] = entry
    return results


def markdown(all_results: dict[str, dict[tuple[str, int], dict[str, Any]]]) -> str:
    lines = ["| model | step | contender | thread CPU ms | ratio to the builder (CPU) | wall ms | ratio (wall) |",
             "|---|---|---|---:|---:|---:|---:|"]
    for model, results in all_results.items():  # model: a model kind, with its load order when several
        for (phase, length), entry in results.items():
            for name, value in entry.items():
                step = f"{phase} {'of' if phase == 'prefill' else 'after'} {length}"
                lines.append(f"| {model} | {step} | {name} | {value['cpu_ms']:.2f} | {value['cpu_ratio']:.3f}x "
                             f"| {value['wall_ms']:.2f} | {value['wall_ratio']:.3f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["llama", "qwen2"], choices=["llama", "qwen2"])
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS))
    parser.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    parser.add_argument("--lengths", nargs="+", type=int, default=[128, 1024])
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (medians)")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime's intra-op threads")
    parser.add_argument("--repeats", type=int, default=3, help="runs of a step per contender and round (the least counts)")
    parser.add_argument("--work", type=Path, help="keep the source models and folders here (reused when present)")
    parser.add_argument("--load-orders", nargs="+", default=["given"], choices=["given", "reversed"],
                        help="create the sessions in the contenders' order, the reverse, or one pass each")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = args.work or Path(scratch)
        for model in args.models:
            source = root / model / "source"
            if not (source / "config.json").exists():
                write_llm_folder(_llm_config(model), source)
            folders = {}
            for name in args.contenders:
                folders[name] = root / model / name
                if not (folders[name] / "genai_config.json").exists():
                    export_contender(name, source, folders[name])
            for order in args.load_orders:
                label = model if len(args.load_orders) == 1 else f"{model} (loaded {order})"
                results[label] = measure(folders, args.lengths, args.rounds, args.threads, args.repeats,
                                         tuple(args.phases), load_reversed=order == "reversed")
    table = markdown(results)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")


if __name__ == "__main__":
    main()
