"""What the Mamba2-style chunked scan's capture rewrite costs at a decode step and a prefill.

The rewrite (`fx2onnx/capture/libraries/transformers_chunked_scans.py`) scans one chunk of
zeros more than the tokens need, so that the number of chunks stays symbolic. This exports
one Mamba2 layer (hidden 1024, 32 heads of 64, state 128, chunks of 128, random weights)
with `export-hf` twice, with the rewrite and without it (transformers' scan as captured:
exact up to one chunk only), and times in onnxruntime (one thread) a decode step of one
token after 4 cached ones and a prefill of 100 tokens (one chunk in both folders), rounds
interleaved: medians of wall time and of the calling thread's CPU time, and their ratios.

    OMP_NUM_THREADS=1 nice -n 10 python bench/chunked_scan_cost.py [--rounds 30]

(about a minute: two exports of a few seconds, then the rounds.)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fx2onnx.capture import library_adapters  # noqa: E402
from fx2onnx.hub import export_hf  # noqa: E402
from fx2onnx.hub.shared.verification import empty_cache, run_session  # noqa: E402


def export(root: Path, rewrite: bool) -> Path:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.Mamba2Config(hidden_size=1024, num_hidden_layers=1, num_heads=32, head_dim=64, n_groups=1,
                                       state_size=128, chunk_size=128, expand=2, vocab_size=1000, bos_token_id=1,
                                       eos_token_id=2, pad_token_id=0)
    transformers.AutoModelForCausalLM.from_config(config).eval().save_pretrained(root / "source")
    original = library_adapters.rewritten_library_functions
    kept = tuple(r for r in library_adapters.CAPTURE_REWRITES if rewrite or r.attribute != "mamba2_chunk_scan")
    library_adapters.rewritten_library_functions = lambda: original(kept)
    try:
        export_hf(root / "source", root / "out", task="text-generation")
    finally:
        library_adapters.rewritten_library_functions = original
    return root / "out" / "onnx" / "model.onnx"


def one_thread_session(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def feed(session, cached: int, new: int) -> dict[str, np.ndarray]:
    inputs = {name: np.zeros(value.shape, value.dtype) for name, value in empty_cache(session, 1).items()}
    inputs["input_ids"] = np.full((1, new), 5, dtype=np.int64)
    inputs["attention_mask"] = np.ones((1, cached + new), dtype=np.int64)
    inputs["position_ids"] = np.arange(cached, cached + new, dtype=np.int64)[None]
    return {k: v for k, v in inputs.items() if k in {i.name for i in session.get_inputs()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    rounds = parser.parse_args().rounds
    with tempfile.TemporaryDirectory() as tmp:
        paths = {"rewritten": export(Path(tmp) / "rewritten", True), "as captured": export(Path(tmp) / "original", False)}
        cases = {"decode step (1 token)": (4, 1), "prefill (100 tokens)": (0, 100)}
        sessions = {name: one_thread_session(path) for name, path in paths.items()}
        for case, (cached, new) in cases.items():
            wall: dict[str, list[float]] = {name: [] for name in sessions}
            cpu: dict[str, list[float]] = {name: [] for name in sessions}
            feeds = {name: feed(session, cached, new) for name, session in sessions.items()}
            for _ in range(rounds):
                for name, session in sessions.items():
                    start, start_cpu = time.perf_counter(), time.thread_time()
                    run_session(session, feeds[name])
                    wall[name].append(time.perf_counter() - start)
                    cpu[name].append(time.thread_time() - start_cpu)
            medians = {name: (statistics.median(wall[name][2:]) * 1e3, statistics.median(cpu[name][2:]) * 1e3)
                       for name in sessions}
            ratio_wall = medians["rewritten"][0] / medians["as captured"][0]
            ratio_cpu = medians["rewritten"][1] / medians["as captured"][1]
            print(f"{case}: rewritten {medians['rewritten'][0]:.2f} ms (CPU {medians['rewritten'][1]:.2f}), as captured "
                  f"{medians['as captured'][0]:.2f} ms (CPU {medians['as captured'][1]:.2f}): {ratio_wall:.2f}x wall, "
                  f"{ratio_cpu:.2f}x CPU")


if __name__ == "__main__":
    main()
