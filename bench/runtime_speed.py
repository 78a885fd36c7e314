"""How fast the exported models run: fx2onnx's folders against ONNX Runtime GenAI's model
builder and `torch.onnx.export(..., dynamo=True)`, from the same weights, in one run.

LLMs (a LLaMA-style and a Qwen2-style model: 4 layers x 512, GQA 8/4 heads, vocab 32000,
random weights, one `save_pretrained` folder each) are exported by

- ``fx2onnx``: `fx2onnx export-hf` as it is (opset 23: attention, rotary embedding, RMS norm and
  GELU as single kernels; for onnxruntime, attention over the cache as its
  GroupQueryAttention, the cache updated in place);
- ``fx2onnx-standard``: `export-hf --runtime standard` (ONNX operators only: the standard
  Attention, the cache grown by Concat);
- ``fx2onnx-opset18``: `export-hf --opset 18` (every node as PyTorch decomposes it, the
  default before the fused kernels);
- ``fx2onnx-functions``: `export-hf --module-functions` (each module call an ONNX function,
  which the runtime inlines when it loads the model);
- ``builder``: `python -m onnxruntime_genai.models.builder -i FOLDER -o OUT -p fp32 -e cpu`;
- ``fx2onnx-int4`` and ``builder-int4``: the same with int4 weights (`export-hf --precision
  int4`, the builder's ``-p int4``), each compared with the other;

and run in the same ONNX Runtime GenAI loop: a prompt of 128 and of 1024 tokens
(prefill time), then 64 greedy tokens (decode ms/token). Rounds are interleaved
(every contender once per round, in a rotated order) and medians reported; the greedy
tokens of every contender are compared with the first contender's of the same precision.
All LLM folders load into this one process, where the model loaded first runs its one-row
products slower than later ones by as much as the folders differ: these timings show the
client's loop end to end, and `step_cpu_time.py` (each folder in its own process) is the
benchmark whose step ratios do not depend on the order.

Encoders (a BERT-style model at sequence 128 and 512, a ViT at 224x224; batch 1) are
exported by fx2onnx (`dynamo_export` at opset 18, its default, and at 23, export-hf's) and
`torch.onnx.export(..., dynamo=True)` and
timed in onnxruntime sessions the same way. Every model's op counts after onnxruntime's
own optimizations are reported too.

    flock /tmp/fx2onnx-heavy.lock python bench/runtime_speed.py [--rounds 5] \\
        [--markdown bench/runtime_speed.md] [--json bench/runtime_speed.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from report_files import write_report  # noqa: E402 - bench modules side by side

import numpy as np

LLM_COMMON = dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2)
PROMPTS = (128, 1024)
NEW_TOKENS = 64
LLM_EXPORTERS = ("fx2onnx", "fx2onnx-standard", "fx2onnx-opset18", "fx2onnx-functions", "builder",
                 "fx2onnx-int4", "builder-int4")
ENCODER_EXPORTERS = ("fx2onnx-opset18", "fx2onnx-opset23", "torch.onnx.export")


def _llm_config(kind: str) -> Any:
    import transformers

    if kind == "llama":
        return transformers.LlamaConfig(**LLM_COMMON)
    return transformers.Qwen2Config(**LLM_COMMON, use_sliding_window=False)


def _write_llm(kind: str, folder: Path) -> None:
    write_llm_folder(_llm_config(kind), folder)


def write_llm_folder(config: Any, folder: Path) -> None:
    """A model of ``config``'s folder, with a byte-level BPE tokenizer trained here (the
    builder writes the runtime's tokenizer files from it)."""
    import tokenizers
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(folder)
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 40, trainer)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>").save_pretrained(folder)


def _precision(exporter: str) -> str:
    """The weights' precision a contender's name says (``-int4``, ``-int8``), float32 otherwise."""
    return next((p for p in ("int4", "int8") if f"-{p}" in exporter), "fp32")


def _export_llm(exporter: str, source: Path, out: Path) -> float:
    started = time.perf_counter()
    precision = _precision(exporter)
    if exporter.startswith("builder"):
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(out),
                   "-p", precision, "-e", "cpu", "-c", str(out.parent / f"builder-cache-{precision}")]
        subprocess.run(command, check=True, capture_output=True, text=True)
    else:
        from fx2onnx.hub import export_hf
        export_hf(source, out, opset=18 if exporter.endswith("opset18") else None,
                  runtime="standard" if exporter.endswith("standard") else "onnxruntime",
                  module_functions=exporter.endswith("functions"),
                  precision=None if precision == "fp32" else precision)
    return time.perf_counter() - started


def _genai_model_file(folder: Path) -> str:
    """The decoder file a genai_config.json names (`onnx/model.onnx` in an export-hf folder)."""
    return json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]["filename"]


def _genai_run(model: Any, prompt: list[int]) -> tuple[float, float, list[int]]:
    """(prefill ms, decode ms/token, greedy tokens) of one generation."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + NEW_TOKENS)
    generator = og.Generator(model, params)
    start = time.perf_counter()
    generator.append_tokens([prompt])
    prefill = time.perf_counter() - start
    decode, tokens = decode_greedily(generator)
    return prefill * 1e3, decode, tokens


def decode_greedily(generator: Any) -> tuple[float, list[int]]:
    """(ms per token, tokens) of a generator's greedy steps to its end."""
    tokens = []
    start = time.perf_counter()
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return (time.perf_counter() - start) / max(len(tokens), 1) * 1e3, tokens


def _rotations(names: list[str], rounds: int) -> list[list[str]]:
    return [names[r % len(names):] + names[:r % len(names)] for r in range(rounds)]


def time_llm(folders: dict[str, Path], rounds: int, load_reversed: bool = False) -> dict[str, Any]:
    """Greedy prefill and decode times per contender. The models are loaded in the
    contenders' order, or in the reverse one with ``load_reversed`` (where a model's
    weights land in memory moves its steps by as much as the folders differ)."""
    import onnxruntime_genai as og

    loading = list(reversed(list(folders))) if load_reversed else list(folders)
    loaded = {name: og.Model(str(folders[name])) for name in loading}
    models = {name: loaded[name] for name in folders}
    prompts = {n: np.random.default_rng(n).integers(3, LLM_COMMON["vocab_size"], n).tolist() for n in PROMPTS}
    samples: dict[tuple[str, int], list[tuple[float, float]]] = collections.defaultdict(list)
    tokens: dict[tuple[str, int], list[int]] = {}
    for name in models:  # warm-up
        _genai_run(models[name], prompts[PROMPTS[0]][:16])
    for order in _rotations(list(models), rounds):
        for name in order:
            for length, prompt in prompts.items():
                prefill, decode, generated = _genai_run(models[name], prompt)
                samples[name, length].append((prefill, decode))
                tokens[name, length] = generated
    # each contender's tokens against the first contender of its precision
    reference = {name: next(n for n in models if _precision(n) == _precision(name)) for name in models}
    return {
        name: {
            length: {
                "prefill_ms": statistics.median(p for p, _ in samples[name, length]),
                "decode_ms_per_token": statistics.median(d for _, d in samples[name, length]),
                "tokens_equal_to_" + reference[name]: tokens[name, length] == tokens[reference[name], length],
            }
            for length in PROMPTS
        }
        for name in models
    }


def _encoder(kind: str) -> tuple[Any, dict[str, Any]]:
    import torch
    import transformers

    torch.manual_seed(0)
    if kind == "vit":
        config = transformers.ViTConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1536)
        return transformers.ViTModel(config).eval(), {"pixel_values": torch.randn(1, 3, 224, 224)}
    length = int(kind.split("-")[1])
    config = transformers.BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1536)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(3, config.vocab_size, (1, length))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _export_encoder(kind: str, exporter: str, path: Path) -> float:
    import torch

    import fx2onnx

    model, inputs = _encoder(kind)
    started = time.perf_counter()
    if exporter == "torch.onnx.export":
        torch.onnx.export(model, (), str(path), kwargs=inputs, dynamo=True, external_data=False)
    else:
        options = fx2onnx.ExportOptions(opset_version=int(exporter.rsplit("opset", 1)[1]))
        fx2onnx.dynamo_export(model, **inputs, export_options=options).save(path)
    return time.perf_counter() - started


def _session(path: Path, optimized: Path | None = None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if optimized is not None:
        options.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def time_encoder(kind: str, paths: dict[str, Path], rounds: int, runs: int) -> dict[str, Any]:
    _, inputs = _encoder(kind)
    sessions = {name: _session(path) for name, path in paths.items()}
    feeds = {}
    for name, session in sessions.items():
        wanted = {i.name for i in session.get_inputs()}
        feeds[name] = {k: v.numpy() for k, v in inputs.items() if k in wanted}
    outputs = {name: session.run(None, feeds[name])[0] for name, session in sessions.items()}
    samples: dict[str, list[float]] = collections.defaultdict(list)
    for order in _rotations(list(sessions), rounds):
        for name in order:
            for _ in range(runs):
                start = time.perf_counter()
                sessions[name].run(None, feeds[name])
                samples[name].append((time.perf_counter() - start) * 1e3)
    reference = outputs.get("torch.onnx.export", next(iter(outputs.values())))
    return {name: {"latency_ms": statistics.median(samples[name]),
                   "largest_difference_to_torch": float(np.abs(outputs[name] - reference).max())} for name in sessions}


def _first_branch_nodes(graph: Any) -> list[Any]:
    """``graph``'s nodes, each `If` with the nodes of its first branch (the branch an
    unpadded prompt or decode step takes in fx2onnx's guarded folders)."""
    nodes = []
    for node in graph.node:
        nodes.append(node)
        if node.op_type == "If":
            nodes += _first_branch_nodes(next(a.g for a in node.attribute if a.name == "then_branch"))
    return nodes


def op_counts(model_path: Path, scratch: Path) -> dict[str, int]:
    """The op types of the model after onnxruntime's own optimizations (what it runs; an
    `If` with its first branch's)."""
    import onnx

    optimized = scratch / "optimized" / f"{model_path.parent.parent.name}-{model_path.parent.name}-{model_path.stem}.onnx"
    optimized.parent.mkdir(exist_ok=True)
    _session(model_path, optimized)
    model = onnx.load(str(optimized), load_external_data=False)
    counts = collections.Counter(node.op_type for node in _first_branch_nodes(model.graph))
    for function in model.functions:
        counts.update(node.op_type for node in function.node)
    return dict(counts.most_common())


def _ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}x" if reference else "-"


def markdown(results: dict[str, Any]) -> str:
    lines = ["## LLMs in ONNX Runtime GenAI (median ms; ratio to the builder)", "",
             "| model | exporter | " + " | ".join(f"prefill {n} | decode after {n} (ms/token)" for n in PROMPTS) + " | tokens equal |",
             "|---|---|" + "---:|---:|" * len(PROMPTS) + "---|"]
    for model, result in results["llms"].items():
        for exporter, timing in result["timing"].items():
            # the builder's folder of the same precision
            builder = result["timing"].get("builder" if _precision(exporter) == "fp32" else f"builder-{_precision(exporter)}")
            cells = []
            for n in PROMPTS:
                entry, base = timing[n], (builder or {}).get(n)
                cells.append(f"{entry['prefill_ms']:.1f} ({_ratio(entry['prefill_ms'], base['prefill_ms']) if base else '-'})")
                cells.append(f"{entry['decode_ms_per_token']:.2f} ({_ratio(entry['decode_ms_per_token'], base['decode_ms_per_token']) if base else '-'})")
            equal = all(next(v for k, v in timing[n].items() if k.startswith("tokens_equal")) for n in PROMPTS)
            lines.append(f"| {model} | {exporter} | " + " | ".join(cells) + f" | {'yes' if equal else 'NO'} |")
    lines += ["", "## Encoders in onnxruntime (median ms; ratio to torch.onnx.export)", "",
              "| model | exporter | latency | ratio | largest difference to torch.onnx.export's output |", "|---|---|---:|---:|---:|"]
    for model, result in results["encoders"].items():
        torch_ms = result["timing"].get("torch.onnx.export", {}).get("latency_ms")
        for exporter, timing in result["timing"].items():
            lines.append(f"| {model} | {exporter} | {timing['latency_ms']:.2f} | {_ratio(timing['latency_ms'], torch_ms) if torch_ms else '-'} "
                         f"| {timing['largest_difference_to_torch']:.1e} |")
    lines += ["", "## Op counts after onnxruntime's optimizations (an If with its first branch's: an unpadded step)", ""]
    for group in ("llms", "encoders"):
        for model, result in results[group].items():
            for exporter, counts in result["op_counts"].items():
                top = ", ".join(f"{op} {count}" for op, count in list(counts.items())[:10])
                lines.append(f"- {model} / {exporter}: {sum(counts.values())} nodes ({top})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llms", nargs="*", default=["llama", "qwen2"], choices=["llama", "qwen2"])
    parser.add_argument("--encoders", nargs="*", default=["bert-128", "bert-512", "vit"], choices=["bert-128", "bert-512", "vit"])
    parser.add_argument("--llm-exporters", nargs="+", default=list(LLM_EXPORTERS), choices=LLM_EXPORTERS)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians)")
    parser.add_argument("--runs", type=int, default=20, help="encoder runs per contender and round")
    parser.add_argument("--work", help="folder for the models (default: a temporary one)")
    parser.add_argument("--llm-load-order", default="given", choices=["given", "reversed"],
                        help="load the LLM folders in --llm-exporters' order or the reverse")
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--markdown", help="write the Markdown tables here")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fx2onnx-runtime-speed-") as temporary:
        work = Path(options.work or temporary)
        work.mkdir(parents=True, exist_ok=True)
        results: dict[str, Any] = {"llms": {}, "encoders": {}}
        for kind in options.llms:
            source = work / kind / "source"
            if not source.exists():
                _write_llm(kind, source)
            folders, seconds = {}, {}
            for exporter in options.llm_exporters:
                out = work / kind / exporter
                if not out.exists():
                    print(f"... exporting {kind} with {exporter}", file=sys.stderr, flush=True)
                    seconds[exporter] = _export_llm(exporter, source, out)
                folders[exporter] = out
            print(f"... timing {kind}", file=sys.stderr, flush=True)
            results["llms"][kind] = {
                "export_seconds": seconds,
                "timing": time_llm(folders, options.rounds, options.llm_load_order == "reversed"),
                "op_counts": {name: op_counts(folder / _genai_model_file(folder), work) for name, folder in folders.items()},
            }
        for kind in options.encoders:
            paths = {}
            for exporter in ENCODER_EXPORTERS:
                path = work / kind / f"{exporter}.onnx"
                path.parent.mkdir(parents=True, exist_ok=True)
                if not path.exists():
                    print(f"... exporting {kind} with {exporter}", file=sys.stderr, flush=True)
                    _export_encoder(kind, exporter, path)
                paths[exporter] = path
            print(f"... timing {kind}", file=sys.stderr, flush=True)
            results["encoders"][kind] = {
                "timing": time_encoder(kind, paths, options.rounds, options.runs),
                "op_counts": {name: op_counts(path, work) for name, path in paths.items()},
            }
    write_report(markdown(results), results, options.markdown, options.json)


if __name__ == "__main__":
    main()
