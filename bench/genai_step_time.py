"""The decode step in ONNX Runtime GenAI's own loop: fx2onnx's causal-LM folder against
another (the builder's), each in a process of its own, by thread CPU time.

A cross-check of `step_cpu_time.py` in the client itself: each folder is run by a fresh
worker process (spawned, one per contender and round, the order alternating) through a
copy of its genai_config.json with one intra-op thread, so onnxruntime runs on the
calling thread and `time.thread_time` counts the step. The worker appends a random prompt
of each length (the prefill) and then times ``--steps`` greedy `generate_next_token` calls
(the first two dropped, the median kept), twice, the least counting. A ratio is the median
over rounds of the first folder's time over the second's in that round.

    OMP_NUM_THREADS=1 nice -n 10 flock /tmp/fx2onnx-heavy.lock python bench/genai_step_time.py \\
        FOLDER REFERENCE [--lengths 128 1024] [--rounds 5] [--steps 24]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def _one_thread_copy(folder: Path, into: Path) -> Path:
    """``folder`` seen through links, but with a genai_config.json of one intra-op thread."""
    for path in folder.iterdir():
        if path.name != "genai_config.json":
            (into / path.name).symlink_to(path.resolve())
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["decoder"].setdefault("session_options", {}).update(intra_op_num_threads=1, inter_op_num_threads=1)
    (into / "genai_config.json").write_text(json.dumps(config))
    return into


def _serve(folder: str, length: int, steps: int, answer: Any) -> None:
    """A worker: (prefill ms, median decode ms) of the best of two generations."""
    import onnxruntime_genai as og

    with tempfile.TemporaryDirectory() as scratch:
        model = og.Model(str(_one_thread_copy(Path(folder), Path(scratch))))
        vocab = json.loads((Path(folder) / "genai_config.json").read_text())["model"]["vocab_size"]
        prompt = np.random.default_rng(length).integers(3, vocab, length).tolist()
        readings = []
        for _ in range(2):
            params = og.GeneratorParams(model)
            params.set_search_options(do_sample=False, max_length=length + steps + 1, min_length=length + steps + 1)
            generator = og.Generator(model, params)
            started = time.thread_time()
            generator.append_tokens([prompt])
            prefill = time.thread_time() - started
            times = []
            for _ in range(steps):
                started = time.thread_time()
                generator.generate_next_token()
                times.append(time.thread_time() - started)
            readings.append((prefill * 1e3, statistics.median(times[2:]) * 1e3))
        answer.put((min(p for p, _ in readings), min(d for _, d in readings)))


def _reading(folder: Path, length: int, steps: int) -> tuple[float, float]:
    context = multiprocessing.get_context("spawn")
    answer = context.Queue()
    process = context.Process(target=_serve, args=(str(folder), length, steps, answer))
    process.start()
    result = answer.get()
    process.join()
    return result


def measure(folder: Path, reference: Path, lengths: list[int], rounds: int, steps: int) -> dict[int, dict[str, float]]:
    """By prompt length: the median per-round ratios of prefill and decode thread CPU time."""
    results = {}
    for length in lengths:
        prefill, decode = [], []
        for index in range(rounds):
            order = [folder, reference] if index % 2 == 0 else [reference, folder]
            times = {path: _reading(path, length, steps) for path in order}
            prefill.append(times[folder][0] / times[reference][0])
            decode.append(times[folder][1] / times[reference][1])
        results[length] = {"prefill_ratio": statistics.median(prefill), "decode_ratio": statistics.median(decode),
                           "decode_ratios": decode}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("reference", type=Path)
    parser.add_argument("--lengths", nargs="+", type=int, default=[128, 1024])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()
    for length, result in measure(args.folder, args.reference, args.lengths, args.rounds, args.steps).items():
        print(f"{args.folder.name} / {args.reference.name} after {length}: prefill {result['prefill_ratio']:.3f}x, "
              f"decode {result['decode_ratio']:.3f}x", flush=True)


if __name__ == "__main__":
    main()
