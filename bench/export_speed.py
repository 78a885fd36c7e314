"""Export speed, memory and model speed: fx2onnx side by side with torch.onnx.export(dynamo=True).

Every export runs in a fresh subprocess: the export measured is the first of its process
(what a user waits for), and the peak RSS is that export's own. Each (model, exporter)
pair is exported --repeats times, the exporters in turns, and the export with the median
time is reported. Exporters:

    fx2onnx          fx2onnx's default (optimized) export
    fx2onnx-noopt    ExportOptions(optimize=False)
    torch            torch.onnx.export(dynamo=True), its default (optimized)
    torch-noopt      torch.onnx.export(dynamo=True, optimize=False)

Reported per pair: export time (fx2onnx: split by stage), peak RSS, ONNX node count
(function bodies included) and file size, onnxruntime latency and PyTorch eager latency
(all exported files of a model run in turns, round after round, so that a busy moment
slows every contender alike; torch's file runs twice, as two contenders, so that the
report shows how far two identical models measure apart; one process per creation order,
the orders rotating so that every model is created once in every position (the session
created first measured up to 2% slower than an identical one created after it); at
least --runs rounds each after warm-up, more until
--latency-seconds have passed, the median of all; eager in a
process of its own); then the ratios fx2onnx / torch. Markdown goes
to stdout (and --markdown), the raw results to --json.

    python bench/export_speed.py                                  # every model
    python bench/export_speed.py --models gpt2 --exporters fx2onnx torch
    python bench/export_speed.py --scaling transformer            # translation nodes/s at 1x, 4x, 16x layers
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

MODELS = ("transformer", "gpt2", "llama", "resnet")
EXPORTERS = ("fx2onnx", "fx2onnx-noopt", "torch", "torch-noopt")
CONTROL = "torch-again"  # torch's file once more, as a latency contender of its own
DESCRIPTIONS = {
    "transformer": "TransformerEncoder, 24 layers, d=256, batch 2 x 64 tokens",
    "gpt2": "GPT-2, 12 layers, 768, 64 tokens",
    "llama": "LLaMA-style, 8 layers, 1024, 64 tokens",
    "resnet": "ResNet-style CNN (ResNet-18 layout), 1 x 3 x 224 x 224",
}


def build(name: str, layers: int | None = None):
    """(model, args) of a benchmark model, its weights as a trained model's (see
    `_like_trained`); `layers` overrides the layer count."""
    model, args = _build_untrained(name, layers)
    return _like_trained(model), args


def _like_trained(model):
    """Give every parameter whose values are all alike (zero biases, unit norm weights of a
    freshly built model) small random values, as training leaves them.

    An optimizer that reads weight values removes an all-zero bias (a Gemm without its
    bias input, a smaller fused kernel): a measurement only an untrained model gets, and a
    model whose weights are replaced later (a checkpoint) silently loses the bias. fx2onnx
    never folds weights; the benchmark compares both exporters on weights they cannot fold.
    """
    import torch

    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.numel() > 1 and bool((parameter == parameter.flatten()[0]).all()):
                parameter.add_(0.02 * torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype))
    return model


def _build_untrained(name: str, layers: int | None):
    import torch

    torch.manual_seed(0)
    if name == "transformer":
        layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, layers or 24, enable_nested_tensor=False)
        return model.eval(), (torch.randn(2, 64, 256),)
    if name == "gpt2":
        import transformers

        config = transformers.GPT2Config(n_layer=layers or 12, n_embd=768, n_head=12, use_cache=False)
        return transformers.GPT2LMHeadModel(config).eval(), (torch.randint(0, config.vocab_size, (1, 64)),)
    if name == "llama":
        import transformers

        config = transformers.LlamaConfig(
            num_hidden_layers=layers or 8,
            hidden_size=1024,
            intermediate_size=2816,
            num_attention_heads=16,
            num_key_value_heads=16,
            vocab_size=32000,
            use_cache=False,
        )
        return transformers.LlamaForCausalLM(config).eval(), (torch.randint(0, config.vocab_size, (1, 64)),)
    if name == "resnet":
        return _resnet(layers or 2).eval(), (torch.randn(1, 3, 224, 224),)
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


def _resnet(blocks_per_stage: int):
    """A ResNet-18-style CNN (no torchvision dependency)."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    stages, cin = [], 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for index in range(blocks_per_stage):
            stages.append(Block(cin, cout, stride if index == 0 else 1))
            cin = cout
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
        *stages, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000),
    )


# -- inside the subprocess -----------------------------------------------------------------


def _peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


def _export(exporter: str, model, args, path: str) -> tuple[float, dict[str, float], object]:
    """Export once and save; (export seconds, fx2onnx's stage seconds, model proto)."""
    import onnx

    if exporter.startswith("fx2onnx"):
        import fx2onnx

        options = fx2onnx.ExportOptions(optimize=exporter == "fx2onnx", progress=False)
        start = time.perf_counter()
        program = fx2onnx.dynamo_export(model, *args, export_options=options)
        seconds = time.perf_counter() - start
        stages = dict(program.stage_seconds)
    else:
        import torch

        start = time.perf_counter()
        program = torch.onnx.export(model, args, dynamo=True, optimize=exporter == "torch", verbose=False)
        seconds = time.perf_counter() - start
        stages = {}
    program.save(path)
    return seconds, stages, onnx.load(path, load_external_data=False)


def _node_count(proto) -> int:
    def count(nodes) -> int:
        total = 0
        for node in nodes:
            total += 1
            for attribute in node.attribute:
                if attribute.HasField("g"):
                    total += count(attribute.g.node)
                total += sum(count(g.node) for g in attribute.graphs)
        return total

    return count(proto.graph.node) + sum(count(f.node) for f in proto.functions)


def _file_mib(path: str) -> float:
    folder = os.path.dirname(path)
    return sum(os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder)) / 2**20


def measure(model_name: str, exporter: str, folder: str, layers: int | None) -> dict:
    warnings.simplefilter("ignore")
    import logging

    logging.disable(logging.WARNING)
    import onnx  # noqa: F401 - both exporters need these libraries: loaded before the clock
    import onnxscript  # noqa: F401

    model, args = build(model_name, layers)
    result: dict = {"model": model_name, "exporter": exporter, "layers": layers}
    os.makedirs(os.path.join(folder, exporter))
    path = os.path.join(folder, exporter, "model.onnx")
    rss_before = _peak_rss_mib()
    seconds, stages, proto = _export(exporter, model, args, path)
    result.update(
        export_seconds=seconds,
        stages=stages,
        peak_rss_mib=_peak_rss_mib(),
        rss_growth_mib=_peak_rss_mib() - rss_before,
        nodes=_node_count(proto),
        file_mib=_file_mib(path),
    )
    return result


def measure_latency(model_name: str, folder: str, exporters: list[str], runs: int, seconds: float, layers: int | None) -> dict:
    """Inside one subprocess: the exported models' sessions are created in the order of
    `exporters`, then run in turns (the order rotating from round to round), so that a
    busy moment of the machine slows all of them alike; the milliseconds of at least `runs`
    rounds per model (after warm-up rounds), more while `seconds` have not passed. With
    no exported model: PyTorch eager."""
    warnings.simplefilter("ignore")
    import numpy as np
    import onnxruntime
    import torch

    model, args = build(model_name, layers)
    runners = {}
    for exporter in exporters:
        path = os.path.join(folder, "torch" if exporter == CONTROL else exporter, "model.onnx")
        if not os.path.exists(path):
            continue
        session_options = onnxruntime.SessionOptions()
        # idle onnxruntime threads must not spin on the cores the next contender runs on
        session_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = onnxruntime.InferenceSession(path, session_options, providers=["CPUExecutionProvider"])
        feeds = {i.name: np.asarray(a) for i, a in zip(session.get_inputs(), args)}
        runners[exporter] = functools.partial(session.run, None, feeds)

    def eager() -> None:
        with torch.no_grad():
            model(*args)

    if not runners:  # eager alone: in a process of its own (thread pools of both would contend)
        runners["eager"] = eager
    times: dict[str, list[float]] = {name: [] for name in runners}
    order = list(runners)
    warm_up, round_, began = 3, 0, time.perf_counter()
    while round_ < runs + warm_up or time.perf_counter() - began < seconds:
        for name in order:
            runners[name]()  # not counted: the first run after another contender warms caches
            start = time.perf_counter()
            runners[name]()
            if round_ >= warm_up:
                times[name].append(1000 * (time.perf_counter() - start))
        order = order[1:] + order[:1]
        round_ += 1
    return times


def latency_ms(model_name: str, folder: str, exporters: list[str], runs: int, seconds: float, layers: int | None) -> dict[str, float]:
    """Median milliseconds per exported model over one process per creation order: the
    orders rotate, so that every model is created once in every position (the session
    created first measured up to 2% slower than an identical one created after it)."""
    pooled: dict[str, list[float]] = {}
    for shift in range(len(exporters)):
        order = exporters[shift:] + exporters[:shift]
        times = _run_child(["--child-latency", model_name, "--folder", folder, "--runs", str(runs), "--latency-seconds", str(seconds), "--exporters", *order], layers)
        if "error" in times:
            return times
        for name, values in times.items():
            pooled.setdefault(name, []).extend(values)
    return {name: statistics.median(values) for name, values in pooled.items()}


def _run_child(arguments: list[str], layers: int | None) -> Any:
    command = [sys.executable, os.path.abspath(__file__), *arguments]
    if layers:
        command += ["--layers", str(layers)]
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        tail = completed.stderr.strip().splitlines()[-1:] or ["(no message)"]
        return {"error": tail[0]}
    return json.loads(completed.stdout.strip().splitlines()[-1])


def benchmark_model(model_name: str, exporters: list[str], runs: int, layers: int | None = None, repeats: int = 3, latency_seconds: float = 6.0) -> list[dict]:
    """Each export `repeats` times, each in its own fresh process, the exporters in turns
    (a busy moment of the machine slows all of them alike); the export with the median
    time is reported. Then the latencies of the first repeat's files."""
    attempts: dict[str, list[dict]] = {exporter: [] for exporter in exporters}
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(repeats):
            target = folder if repeat == 0 else os.path.join(folder, f"repeat{repeat}")
            for exporter in exporters:
                print(f"... {model_name} with {exporter} ({repeat + 1}/{repeats})", file=sys.stderr, flush=True)
                attempts[exporter].append(_run_child(["--child", model_name, exporter, "--folder", target], layers))
        results = [{"model": model_name, "exporter": exporter, "layers": layers, **_median_export(attempts[exporter])} for exporter in exporters]
        if runs:
            print(f"... {model_name}: onnxruntime and eager latency", file=sys.stderr, flush=True)
            contenders = list(exporters)
            if os.path.isdir(os.path.join(folder, "torch")):
                # torch's file once more, in a session of its own: how far two identical
                # models measure apart in this run (the noise of the ratios).
                contenders.append(CONTROL)
            latency = latency_ms(model_name, folder, contenders, runs, latency_seconds, layers)
            eager = latency_ms(model_name, folder, ["none"], runs, latency_seconds, layers)
            for result in results:
                if result["exporter"] in latency:
                    result["ort_ms"] = latency[result["exporter"]]
                if result["exporter"] == "torch" and CONTROL in latency:
                    result["ort_ms_same_file_again"] = latency[CONTROL]
                if "eager" in eager:
                    result["eager_ms"] = eager["eager"]
    return results


def _median_export(attempts: list[dict]) -> dict:
    """The attempt with the median export time (all its figures: stages, memory, size),
    with every attempt's time; an error when no attempt succeeded."""
    done = sorted((a for a in attempts if "error" not in a), key=lambda a: a["export_seconds"])
    if not done:
        return attempts[0]
    return {**done[(len(done) - 1) // 2], "export_seconds_all": [a["export_seconds"] for a in done]}


# -- the report ------------------------------------------------------------------------------

_STAGES = (
    "registry", "capture", "decomposition", "passes", "analysis", "translation", "legalization", "optimization", "validation",
)


def markdown(results: list[dict]) -> str:
    lines = [
        "| model | exporter | export s | " + " | ".join(_STAGES) + " | other | peak RSS MiB | nodes | file MiB | ORT ms | eager ms |",
        "|---|---|---:|" + "---:|" * len(_STAGES) + "---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['exporter']} | failed: {r['error']} |")
            continue
        stages = " | ".join(f"{r['stages'][s]:.2f}" if s in r["stages"] else "" for s in _STAGES)
        # Time outside every stage (argument checks, building the program object).
        other = f"{r['export_seconds'] - sum(r['stages'].values()):.2f}" if r["stages"] else ""
        stages += f" | {other}"
        lines.append(
            f"| {r['model']} | {r['exporter']} | {r['export_seconds']:.2f} | {stages} | {r['peak_rss_mib']:.0f} | "
            f"{r['nodes']} | {r['file_mib']:.1f} | {r.get('ort_ms', float('nan')):.2f} | {r.get('eager_ms', float('nan')):.2f} |"
        )
    lines += ["", "Ratios: export time of each fx2onnx mode against the same torch mode; the rest fx2onnx's default (optimizing):", ""]
    lines.append(
        "| model | fx2onnx-noopt vs torch-noopt | fx2onnx vs torch | ORT latency vs torch | torch's file vs itself (noise) | ORT vs eager | "
        "decomposition % | translation % | translation+passes % | peak RSS vs torch |"
    )
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    by_key = {(r["model"], r["exporter"]): r for r in results if "error" not in r}
    for model in dict.fromkeys(r["model"] for r in results):
        ours, ours_noopt = by_key.get((model, "fx2onnx")), by_key.get((model, "fx2onnx-noopt"))
        torch_opt, torch_noopt = by_key.get((model, "torch")), by_key.get((model, "torch-noopt"))
        if ours is None:
            continue

        def ratio(a: float | None, b: float | None) -> str:
            return f"{a / b:.2f}x" if a is not None and b else "n/a"

        total = ours["export_seconds"]
        share = lambda *names: f"{100 * sum(ours['stages'].get(n, 0.0) for n in names) / total:.1f}"  # noqa: E731
        lines.append(
            f"| {model} | {ratio(ours_noopt and ours_noopt['export_seconds'], torch_noopt and torch_noopt['export_seconds'])} "
            f"| {ratio(total, torch_opt and torch_opt['export_seconds'])} "
            f"| {ratio(ours.get('ort_ms'), torch_opt and torch_opt.get('ort_ms'))} "
            f"| {ratio(torch_opt and torch_opt.get('ort_ms_same_file_again'), torch_opt and torch_opt.get('ort_ms'))} "
            f"| {ratio(ours.get('ort_ms'), ours.get('eager_ms'))} "
            f"| {share('decomposition')} | {share('translation')} | {share('translation', 'passes')} "
            f"| {ratio(ours['peak_rss_mib'], torch_opt and torch_opt['peak_rss_mib'])} |"
        )
    return "\n".join(lines)


_SCALING_MODES = {
    "default": "repeated layers reuse one translation",
    "every-call": "every module call translated (ModuleFunctionOptions(share_identical=False))",
}


def scaling_markdown(results: list[dict]) -> str:
    lines = [
        "| layers | mode | FX nodes | FX nodes translated | translation s | translated nodes/s | passes s | total s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['layers']} | {r['mode']} | failed: {r['error']} |")
            continue
        rate = r["fx_nodes_translated"] / r["stages"]["translation"]
        lines.append(
            f"| {r['layers']} | {r['mode']} | {r['fx_nodes']} | {r['fx_nodes_translated']} | {r['stages']['translation']:.2f} | "
            f"{rate:.0f} | {r['stages'].get('passes', 0):.2f} | {r['export_seconds']:.2f} |"
        )
    modes = "; ".join(f"{mode}: {text}" for mode, text in _SCALING_MODES.items())
    return "\n".join(lines) + f"\n\nModes: {modes}."


def measure_scaling(model_name: str, layers: int, mode: str) -> dict:
    """Inside the subprocess: one export of `layers` layers; FX nodes (all, and those
    translated rather than covered by a reused translation) and stage times."""
    warnings.simplefilter("ignore")
    import fx2onnx
    import fx2onnx.translate.interpreter
    import fx2onnx.translate.module_functions

    model, args = build(model_name, layers)
    translated, reused = [0], [0]
    hook = fx2onnx.translate.interpreter.node_translated  # the progress hook: once per FX node translated

    def count_translated(count: int = 1) -> None:
        translated[0] += count
        hook(count)

    def count_reused(count: int = 1) -> None:  # the nodes of a reused translation
        reused[0] += count
        hook(count)

    fx2onnx.translate.interpreter.node_translated = count_translated
    fx2onnx.translate.module_functions.node_translated = count_reused
    functions = fx2onnx.ModuleFunctionOptions(share_identical=mode == "default")
    options = fx2onnx.ExportOptions(optimize=False, progress=False, module_functions=functions)
    start = time.perf_counter()
    program = fx2onnx.dynamo_export(model, *args, export_options=options)
    seconds = time.perf_counter() - start
    return {
        "model": model_name, "layers": layers, "mode": mode, "export_seconds": seconds, "stages": dict(program.stage_seconds),
        "fx_nodes": translated[0] + reused[0], "fx_nodes_translated": translated[0],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--exporters", nargs="+", default=list(EXPORTERS), choices=(*EXPORTERS, CONTROL, "none"))
    parser.add_argument("--runs", type=int, default=20, help="onnxruntime / eager rounds per model and process, at least (median)")
    parser.add_argument("--latency-seconds", type=float, default=6.0, help="more rounds until this long per latency process")
    parser.add_argument("--repeats", type=int, default=3, help="exports per (model, exporter), each in a fresh process (median)")
    parser.add_argument("--layers", type=int, help="override every model's layer count")
    parser.add_argument("--scaling", choices=MODELS, help="translation speed at 1x, 4x and 16x --layers (default 24)")
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--markdown", help="write the Markdown tables here")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "EXPORTER"), help=argparse.SUPPRESS)
    parser.add_argument("--child-latency", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--child-scaling", nargs=3, metavar=("MODEL", "LAYERS", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        print(json.dumps(measure(*options.child, options.folder, options.layers)))
        return
    if options.child_latency:
        print(json.dumps(measure_latency(options.child_latency, options.folder, options.exporters, options.runs, options.latency_seconds, options.layers)))
        return
    if options.child_scaling:
        print(json.dumps(measure_scaling(options.child_scaling[0], int(options.child_scaling[1]), options.child_scaling[2])))
        return
    header = f"torch {_version('torch')}, onnxscript {_version('onnxscript')}, onnxruntime {_version('onnxruntime')}, fx2onnx {_version('fx2onnx')}"
    if options.scaling:
        base = options.layers or 24
        results = []
        for mode in _SCALING_MODES:
            for factor in (1, 4, 16):
                print(f"... {options.scaling} with {base * factor} layers, {mode}", file=sys.stderr, flush=True)
                result = _run_child(["--child-scaling", options.scaling, str(base * factor), mode], None)
                results.append({"layers": base * factor, "mode": mode, **result})
        text = f"{header}\n\n{scaling_markdown(results)}"
    else:
        results = []
        for model in options.models:
            results += benchmark_model(model, options.exporters, options.runs, options.layers, options.repeats, options.latency_seconds)
        models = "\n".join(f"- {m}: {DESCRIPTIONS[m]}" for m in options.models)
        text = f"{header}; median of {options.repeats} exports, each in a fresh process; latency: median over one process per rotation of the session creation order, each at least {options.runs} interleaved rounds and {options.latency_seconds:g} s\n\n{models}\n\n{markdown(results)}"
    print(text)
    if options.markdown:
        with open(options.markdown, "w", encoding="utf-8") as stream:
            stream.write(text + "\n")
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
