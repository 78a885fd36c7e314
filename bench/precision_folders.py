"""What `export-hf --precision int4|int8` gives and costs: file size and speed of the
quantized folders against the float folder and ONNX Runtime GenAI's model builder's
``-p int4 -e cpu`` folder, from the same weights; with ``--encoder``, what int8 gives an
encoder (`encoder_int8`).

The model is `runtime_speed.py`'s LLaMA-style one (4 layers x 512, GQA 8/4 heads, vocab
32000, random weights); every folder runs in the same ONNX Runtime GenAI loop (a prompt of
128 and of 1024 tokens, then 64 greedy tokens; interleaved rounds, medians).
``fx2onnx-int4-packed`` is `export_hf(..., pack_projections=True)`: Q, K and V (and gate
and up) as one MatMulNBits and a Split, as the builder packs Q, K and V;
``fx2onnx-int4-embedding`` is `export_hf(..., quantize_embedding=True)`. Random
weights give flat logits, so token agreement between int4 folders says little: quality
needs a trained model: `int4_quality.py` measures it.

    flock /tmp/fx2onnx-heavy.lock python bench/precision_folders.py [--rounds 3] [--sizes-only] \\
        [--markdown bench/precision_folders.md]
    flock /tmp/fx2onnx-heavy.lock python bench/precision_folders.py --encoder [--rounds 5]
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

CONTENDERS = ("fx2onnx-fp32", "fx2onnx-int4", "fx2onnx-int8", "fx2onnx-int4-packed", "fx2onnx-int4-embedding", "builder-int4")
MB = 1e6


def export_contender(contender: str, source: Path, out: Path) -> float:
    """Write ``contender``'s folder (`builder-int4`, `fx2onnx-int4-packed-embedding`, ...); its seconds."""
    started = time.perf_counter()
    exporter, precision, *extras = contender.split("-")
    if exporter == "builder":
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(out),
                   "-p", precision, "-e", "cpu", "-c", str(out.parent / "builder-cache")]
        if "kquant" in extras:  # the builder's k-quant scale search (its own int4 beyond round-to-nearest)
            command += ["--extra_options", "algo_config=k_quant"]
        subprocess.run(command, check=True, capture_output=True, text=True)
    else:
        from fx2onnx.hub import DEFAULT_ALGORITHM, QUANTIZATION_ALGORITHMS, export_hf
        algorithm = next((a for a in QUANTIZATION_ALGORITHMS if a in extras), DEFAULT_ALGORITHM)
        # blockN: --block-size N (every layer's and the LM head's block)
        block_size = next((int(e.removeprefix("block")) for e in extras if e.startswith("block")), None)
        export_hf(source, out, precision=precision, pack_projections="packed" in extras,
                  quantize_embedding="embedding" in extras, quantization_algorithm=algorithm,
                  mixed_precision="mixed" in extras, block_size=block_size)
    return time.perf_counter() - started


def folder_bytes(folder: Path) -> int:
    """The model's files: every .onnx and its external data (export-hf's are under onnx/)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.name.endswith((".onnx", ".data", ".onnx_data")))


def op_counts(folder: Path) -> dict[str, int]:
    import collections

    import onnx

    path = folder / json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]["filename"]
    model = onnx.load(str(path), load_external_data=False)
    return dict(collections.Counter(node.op_type for node in model.graph.node).most_common(6))


def markdown(results: dict[str, Any]) -> str:
    sizes, timing = results["bytes"], results.get("timing", {})
    base, builder = sizes.get("fx2onnx-fp32"), sizes.get("builder-int4")
    lines = ["| folder | size (MB) | vs fp32 | vs builder int4 | "
             + " | ".join(f"prefill {n} ms | decode after {n} ms/token" for n in PROMPTS) + " |",
             "|---|---:|---:|---:|" + "---:|---:|" * len(PROMPTS)]
    for name, size in sizes.items():
        cells = [f"{size / MB:.1f}", f"{size / base:.3f}x" if base else "-", f"{size / builder:.3f}x" if builder else "-"]
        for n in PROMPTS:
            entry = timing.get(name, {}).get(n)
            cells += [f"{entry['prefill_ms']:.1f}", f"{entry['decode_ms_per_token']:.2f}"] if entry else ["-", "-"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", *(f"- {name}: {counts}" for name, counts in results["op_counts"].items())]
    return "\n".join(lines)


ENCODER_BATCHES, ENCODER_LENGTH = (1, 8), 128


def _encoder_folders(work: Path) -> dict[str, Path]:
    """A BERT (4 layers x 256, random weights) exported float and int8 by export-hf, and the
    float file quantized by onnxruntime's ``quantize_dynamic`` (per tensor, its default;
    MatMuls only: it takes opset 23's ``Attention`` for its own contrib operator and writes
    a ``QAttention`` that onnxruntime refuses)."""
    import shutil

    import torch
    import transformers
    from onnxruntime.quantization import quantize_dynamic

    from fx2onnx.hub import export_hf
    source = work / "bert-source"
    if not source.exists():
        torch.manual_seed(0)
        config = transformers.BertConfig(vocab_size=30522, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                                         num_attention_heads=4)
        transformers.BertModel(config).eval().save_pretrained(source)
    folders = {"fx2onnx-fp32": work / "bert-fp32", "fx2onnx-int8": work / "bert-int8"}
    for name, folder in folders.items():
        if not folder.exists():
            export_hf(source, folder, precision=name.split("-")[1])
    tool = work / "bert-quantize_dynamic"
    if not tool.exists():
        shutil.copytree(folders["fx2onnx-fp32"], tool)
        quantize_dynamic(tool / "onnx" / "model.onnx", tool / "onnx" / "model_quantized.onnx", use_external_data_format=True,
                         op_types_to_quantize=["MatMul"])
        (tool / "onnx" / "model.onnx").unlink()
        (tool / "onnx" / "model.onnx_data").unlink()
    folders["quantize_dynamic"] = tool
    return folders


def encoder_int8(work: Path, rounds: int, runs: int = 20) -> dict[str, Any]:
    """Latency (one onnxruntime thread, interleaved rounds, medians) and the largest
    difference from PyTorch of the int8 encoders against the float one."""
    import statistics

    import numpy as np
    import onnxruntime as ort
    import torch
    import transformers
    from ecosystem_tools import median_seconds

    folders = _encoder_folders(work)
    model = transformers.BertModel.from_pretrained(work / "bert-source").eval()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sessions = {name: ort.InferenceSession(str(next((f / "onnx").glob("*.onnx"))), options, providers=["CPUExecutionProvider"])
                for name, f in folders.items()}
    results: dict[str, Any] = {"ms": {}, "error": {}, "bytes": {n: folder_bytes(f) for n, f in folders.items()}}
    for batch in ENCODER_BATCHES:
        ids = torch.randint(3, 30522, (batch, ENCODER_LENGTH), generator=torch.Generator().manual_seed(batch))
        feed = {"input_ids": ids.numpy(), "attention_mask": np.ones_like(ids.numpy()),
                "token_type_ids": np.zeros_like(ids.numpy())}
        with torch.no_grad():
            expected = model(input_ids=ids).last_hidden_state.numpy()
        times: dict[str, list[float]] = {name: [] for name in sessions}
        for _ in range(rounds):
            for name, session in sessions.items():
                times[name].append(median_seconds(session, feed, runs))
        for name, session in sessions.items():
            results["ms"].setdefault(name, {})[batch] = 1000 * statistics.median(times[name])
            actual = session.run(["last_hidden_state"], feed)[0]
            error = float(np.abs(actual - expected).max()) / float(np.abs(expected).max())
            results["error"].setdefault(name, {})[batch] = error
    return results


def encoder_markdown(results: dict[str, Any]) -> str:
    base = results["ms"]["fx2onnx-fp32"]
    lines = ["| file | size (MB) | " + " | ".join(f"batch {b} ms | vs fp32" for b in ENCODER_BATCHES)
             + " | largest difference from PyTorch (share of the largest output) |",
             "|---|---:|" + "---:|---:|" * len(ENCODER_BATCHES) + "---:|"]
    for name, ms in results["ms"].items():
        cells = [f"{results['bytes'][name] / MB:.1f}"]
        cells += [f"{ms[b]:.1f} | {ms[b] / base[b]:.2f}x" for b in ENCODER_BATCHES]
        cells.append(f"{max(results['error'][name].values()):.2e}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument("--sizes-only", action="store_true", help="export and measure sizes, no timing")
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    parser.add_argument("--work", help="folder for the models (default: a temporary one)")
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--markdown", help="write the Markdown table here")
    parser.add_argument("--encoder", action="store_true", help="int8 of a BERT encoder (4 x 256, sequence 128) instead")
    options = parser.parse_args(argv)
    if options.encoder:
        with tempfile.TemporaryDirectory(prefix="fx2onnx-precision-") as temporary:
            encoder = encoder_int8(Path(options.work or temporary), options.rounds)
        print(encoder_markdown(encoder))
        if options.json:
            Path(options.json).write_text(json.dumps(encoder, indent=2) + "\n")
        return
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
                seconds[contender] = export_contender(contender, source, out)
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
