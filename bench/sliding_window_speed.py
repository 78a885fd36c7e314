"""Decode steps of sliding-window models at a long context: `export-hf`'s folder against
ONNX Runtime GenAI's model builder, from the same weights, in one run.

Two models of 4 layers x 512 (GQA 8/4 heads, vocab 32000, random weights): a
Gemma-3-text-shaped one (window 512, three local layers then a global one) and a
gpt-oss-shaped one (window 128, local and global layers interleaved, attention sinks,
4 experts of which 2 per token). Each is exported by `fx2onnx export-hf` (default folder)
and by `python -m onnxruntime_genai.models.builder -p fp32 -e cpu`, then run in the same
ONNX Runtime GenAI loop: a prompt of CONTEXT - NEW_TOKENS tokens, then NEW_TOKENS greedy
tokens, so that the last steps run at a context of CONTEXT tokens (decode ms/token,
medians of interleaved rounds), by wall time and by the CPU time of the decoding thread
(each session runs on that one thread, `intra_op_num_threads` 1 in both folders, so the
CPU time counts the folder's own work whatever else runs on the machine). The cache each
folder holds at the end is measured from
the runtime's `present.*` tensors (`Generator.get_output`): the bytes of every layer's
key and value buffers; the greedy tokens of both folders are compared too.

Both folders give their sliding layers a window-sized cache in ONNX Runtime GenAI
(export-hf's decoder for the runtime, `onnx/model_windowed_cache.onnx`).

    OMP_NUM_THREADS=1 nice -n 10 python bench/sliding_window_speed.py [--rounds 3] \\
        [--markdown bench/sliding_window_speed.md] [--json bench/sliding_window_speed.json]

(a few minutes: two exports a model, then 3 rounds of a 2016-token prompt and 32 tokens
a folder.)
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from report_files import write_report  # noqa: E402
from runtime_speed import _export_llm, _rotations, decode_greedily, write_llm_folder  # noqa: E402 - bench modules side by side

# The builder (0.18) reads a Gemma 3 config as transformers 4 wrote it: one flat
# `rope_parameters` and `rope_local_base_freq`; transformers 5 nests both by layer type.
# It gets a copy of the folder with the flat keys added, and runs with the local theta
# read from the nested ones.
_GEMMA3_BUILDER = (
    "import runpy, sys, transformers\n"
    "transformers.Gemma3TextConfig.rope_local_base_freq = property(\n"
    "    lambda self: self.rope_parameters['sliding_attention']['rope_theta'])\n"
    "sys.argv = ['builder', *sys.argv[1:]]\n"
    "runpy.run_module('onnxruntime_genai.models.builder', run_name='__main__')\n"
)

CONTEXT, NEW_TOKENS = 2048, 32
COMMON = dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
              head_dim=64, vocab_size=32000, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=0)
EXPORTERS = ("fx2onnx", "builder")


def model_config(kind: str) -> Any:
    import transformers

    if kind == "gemma3-text":
        return transformers.Gemma3TextConfig(**COMMON, sliding_window=512, layer_types=["sliding_attention"] * 3 + ["full_attention"])
    return transformers.GptOssConfig(**{**COMMON, "intermediate_size": 512}, sliding_window=128, num_local_experts=4,
                                     num_experts_per_tok=2)


def _export_gemma3_with_builder(source: Path, out: Path) -> None:
    flat = out.parent / "source-builder"
    shutil.copytree(source, flat, dirs_exist_ok=True)
    config = json.loads((flat / "config.json").read_text())
    nested = config["rope_parameters"]
    config["rope_parameters"] = {**nested, "rope_type": "default", "rope_theta": nested["full_attention"]["rope_theta"]}
    (flat / "config.json").write_text(json.dumps(config))
    command = [sys.executable, "-c", _GEMMA3_BUILDER, "-i", str(flat), "-o", str(out), "-p", "fp32", "-e", "cpu",
               "-c", str(out.parent / "builder-cache")]
    subprocess.run(command, check=True, capture_output=True, text=True)


def _on_one_thread(folder: Path) -> None:
    """The folder's sessions run on the calling thread (the thread CPU time is their work)."""
    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"]["decoder"].setdefault("session_options", {})["intra_op_num_threads"] = 1
    path.write_text(json.dumps(config, indent=4))


def _run(model: Any, prompt: list[int]) -> tuple[float, float, list[int], int]:
    """(decode ms/token, decode thread-CPU ms/token, greedy tokens, bytes of the cache
    buffers at the end) of one generation."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    length = len(prompt) + NEW_TOKENS
    params.set_search_options(do_sample=False, max_length=length, min_length=length)
    generator = og.Generator(model, params)
    generator.append_tokens([prompt])
    started = time.thread_time()
    decode, tokens = decode_greedily(generator)
    cpu = (time.thread_time() - started) / max(len(tokens), 1) * 1e3
    cache = 0
    for layer in range(COMMON["num_hidden_layers"]):
        for kind in ("key", "value"):
            cache += generator.get_output(f"present.{layer}.{kind}").nbytes
    return decode, cpu, tokens, cache


def time_folders(folders: dict[str, Path], rounds: int) -> dict[str, Any]:
    import onnxruntime_genai as og

    models = {name: og.Model(str(folder)) for name, folder in folders.items()}
    prompt = np.random.default_rng(0).integers(3, COMMON["vocab_size"], CONTEXT - NEW_TOKENS).tolist()
    for model in models.values():  # warm-up (the builder's windowed cache needs max_length >= the window)
        _run(model, prompt)
    samples: dict[str, list[float]] = collections.defaultdict(list)
    cpu: dict[str, list[float]] = collections.defaultdict(list)
    tokens: dict[str, list[int]] = {}
    cache: dict[str, int] = {}
    for order in _rotations(list(models), rounds):
        for name in order:
            decode, decode_cpu, tokens[name], cache[name] = _run(models[name], prompt)
            samples[name].append(decode)
            cpu[name].append(decode_cpu)
    return {name: {"decode_ms_per_token": statistics.median(samples[name]), "decode_cpu_ms_per_token": statistics.median(cpu[name]),
                   "cache_mb": cache[name] / 2**20, "tokens_equal_to_fx2onnx": tokens[name] == tokens["fx2onnx"]}
            for name in models}


def markdown(results: dict[str, Any]) -> str:
    lines = [f"## Decode at a {CONTEXT}-token context in ONNX Runtime GenAI (median ms/token; cache at the end)", "",
             "| model | folder | decode ms/token | ratio to the builder | thread CPU ms/token | CPU ratio to the builder "
             "| cache MB | tokens equal to fx2onnx's |",
             "|---|---|---|---|---|---|---|---|"]
    for kind, timing in results.items():
        builder, builder_cpu = timing["builder"]["decode_ms_per_token"], timing["builder"]["decode_cpu_ms_per_token"]
        for name, entry in timing.items():
            lines.append(f"| {kind} | {name} | {entry['decode_ms_per_token']:.2f} | "
                         f"{entry['decode_ms_per_token'] / builder:.2f}x | {entry['decode_cpu_ms_per_token']:.2f} | "
                         f"{entry['decode_cpu_ms_per_token'] / builder_cpu:.2f}x | {entry['cache_mb']:.1f} | "
                         f"{entry['tokens_equal_to_fx2onnx']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=["gemma3-text", "gpt-oss"], choices=["gemma3-text", "gpt-oss"])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument("--work", help="folder for the models (default: a temporary one)")
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--markdown", help="write the Markdown table here")
    options = parser.parse_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="fx2onnx-sliding-window-") as temporary:
        work = Path(options.work or temporary)
        for kind in options.models:
            source = work / kind / "source"
            if not source.exists():
                write_llm_folder(model_config(kind), source)
            folders = {}
            for exporter in EXPORTERS:
                out = work / kind / exporter
                if not out.exists():
                    print(f"... exporting {kind} with {exporter}", file=sys.stderr, flush=True)
                    if exporter == "builder" and kind == "gemma3-text":
                        _export_gemma3_with_builder(source, out)
                    else:
                        _export_llm(exporter, source, out)
                _on_one_thread(out)
                folders[exporter] = out
            print(f"... timing {kind}", file=sys.stderr, flush=True)
            results[kind] = time_folders(folders, options.rounds)
    write_report(markdown(results), results, options.markdown, options.json)


if __name__ == "__main__":
    main()
