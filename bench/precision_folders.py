"""What `export-hf --precision int4|int8` gives and costs: file size and speed of the
quantized folders against the float folder and ONNX Runtime GenAI's model builder's
``-p int4 -e cpu`` folder, from the same weights.

The model is `runtime_speed.py`'s LLaMA-style one (4 layers x 512, GQA 8/4 heads, vocab
32000, random weights); every folder runs in the same ONNX Runtime GenAI loop (a prompt of
128 and of 1024 tokens, then 64 greedy tokens; interleaved rounds, medians).
``fx2onnx-int4-packed`` is `export_hf(..., pack_projections=True)`: Q, K and V (and gate
and up) as one MatMulNBits and a Split, as the builder packs Q, K and V. Random
weights give flat logits, so token agreement between int4 folders says little: quality
needs a trained model: `int4_quality.py` measures it.

    flock /tmp/fx2onnx-heavy.lock python bench/precision_folders.py [--rounds 3] [--sizes-only] \\
        [--markdown bench/precision_folders.md]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from runtime_speed import PROMPTS, _write_llm, time_llm

CONTENDERS = ("fx2onnx-fp32", "fx2onnx-int4", "fx2onnx-int8", "fx2onnx-int4-packed", "builder-int4")
MB = 1e6


def _export(contender: str, source: Path, out: Path) -> float:
    started = time.perf_counter()
    exporter, precision, *packed = contender.split("-")
    if exporter == "builder":
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(out),
                   "-p", precision, "-e", "cpu", "-c", str(out.parent / "builder-cache")]
        subprocess.run(command, check=True, capture_output=True, text=True)
    else:
        from fx2onnx.hub import export_hf

        export_hf(source, out, precision=precision, pack_projections=bool(packed))
    return time.perf_counter() - started


def folder_bytes(folder: Path) -> int:
    """The model's files: every .onnx and its external data."""
    return sum(f.stat().st_size for f in folder.iterdir() if f.name.endswith((".onnx", ".data")))


def op_counts(folder: Path) -> dict[str, int]:
    import collections

    import onnx

    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    return dict(collections.Counter(node.op_type for node in model.graph.node).most_common(6))


def markdown(results: dict[str, Any]) -> str:
    sizes, timing = results["bytes"], results.get("timing", {})
    base, builder = sizes["fx2onnx-fp32"], sizes.get("builder-int4")
    lines = ["| folder | size (MB) | vs fp32 | vs builder int4 | "
             + " | ".join(f"prefill {n} ms | decode after {n} ms/token" for n in PROMPTS) + " |",
             "|---|---:|---:|---:|" + "---:|---:|" * len(PROMPTS)]
    for name, size in sizes.items():
        cells = [f"{size / MB:.1f}", f"{size / base:.3f}x", f"{size / builder:.3f}x" if builder else "-"]
        for n in PROMPTS:
            entry = timing.get(name, {}).get(n)
            cells += [f"{entry['prefill_ms']:.1f}", f"{entry['decode_ms_per_token']:.2f}"] if entry else ["-", "-"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", *(f"- {name}: {counts}" for name, counts in results["op_counts"].items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument("--sizes-only", action="store_true", help="export and measure sizes, no timing")
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    parser.add_argument("--work", help="folder for the models (default: a temporary one)")
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--markdown", help="write the Markdown table here")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fx2onnx-precision-") as temporary:
        work = Path(options.work or temporary)
        source = work / "source"
        if not source.exists():
            _write_llm("llama", source)
        folders, seconds = {}, {}
        for contender in options.contenders:
            out = work / contender
            if not out.exists():
                print(f"... exporting with {contender}", file=sys.stderr, flush=True)
                seconds[contender] = _export(contender, source, out)
            folders[contender] = out
        results: dict[str, Any] = {
            "export_seconds": seconds,
            "bytes": {name: folder_bytes(folder) for name, folder in folders.items()},
            "op_counts": {name: op_counts(folder) for name, folder in folders.items()},
        }
        if not options.sizes_only:
            print("... timing", file=sys.stderr, flush=True)
            results["timing"] = time_llm(folders, options.rounds)
    table = markdown(results)
    print(table)
    if options.json:
        Path(options.json).write_text(json.dumps(results, indent=2, default=str) + "\n")
    if options.markdown:
        Path(options.markdown).write_text(table + "\n")


if __name__ == "__main__":
    main()
