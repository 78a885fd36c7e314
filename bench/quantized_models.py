"""Latency of PyTorch-quantized models in onnxruntime, against their float export.

A 2-layer `nn.TransformerEncoder` (width 256, feed-forward 1024, 64 tokens) quantized with
PT2E and torchao's `X86InductorQuantizer` (static int8), exported by fx2onnx and by
`torch.onnx.export(..., dynamo=True)`; fx2onnx both as one flat graph and with its default
options (module functions); each quantized file's median latency over N runs is divided by
the float export's of the same exporter and options, rounds interleaved in one process.

    python bench/quantized_models.py [--runs 50] [--rounds 3] [--width 256] [--threads 1]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import warnings
from pathlib import Path

import onnxruntime as ort
import torch

import fx2onnx
from ecosystem_tools import median_seconds  # bench/, beside this script


# fx2onnx's contenders: the flat graph, and the default options (module functions)
FX2ONNX_CONTENDERS = {"fx2onnx": False, "fx2onnx functions": True}


def quantized(model: torch.nn.Module, example: torch.Tensor) -> torch.nn.Module:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

    quantizer = x86.X86InductorQuantizer()
    quantizer.set_global(x86.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(torch.export.export(model, (example,)).module(), quantizer)
    prepared(example)
    return convert_pt2e(prepared)


def session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(os.fspath(path), options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime's intra-op threads (default 1: steadier)")
    arguments = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.manual_seed(0)
    width = arguments.width
    layer = torch.nn.TransformerEncoderLayer(width, 4, 4 * width, batch_first=True, dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(1, 64, width)
    int8 = quantized(model, x)
    with tempfile.TemporaryDirectory() as temp:
        files = {}
        for label, network in (("float", model), ("int8", int8)):
            for exporter, functions in FX2ONNX_CONTENDERS.items():
                path = Path(temp) / f"{exporter.replace(' ', '_')}_{label}.onnx"
                options = fx2onnx.ExportOptions(module_functions=functions, failure_report_path=None)
                fx2onnx.dynamo_export(network, x, export_options=options).save(path)
                files[(exporter, label)] = path
            path = Path(temp) / f"torch_onnx_{label}.onnx"
            torch.onnx.export(network, (x,), os.fspath(path), dynamo=True, verbose=False)
            files[("torch.onnx", label)] = path
        sessions = {key: session(path, arguments.threads) for key, path in files.items()}
        feed = {sessions[("fx2onnx", "float")].get_inputs()[0].name: x.numpy()}
        seconds: dict[tuple[str, str], list[float]] = {key: [] for key in files}
        for _ in range(arguments.rounds):
            for key, runner in sessions.items():
                name = runner.get_inputs()[0].name
                seconds[key].append(median_seconds(runner, {name: feed[next(iter(feed))]}, arguments.runs))
    print(f"torch {torch.__version__}, onnxruntime {ort.__version__}; TransformerEncoder 2 x {width}, 64 tokens")
    print("| exporter | float ms | int8 ms | int8 / float |\n|---|---|---|---|")
    for exporter in (*FX2ONNX_CONTENDERS, "torch.onnx"):
        float_ms = statistics.median(seconds[(exporter, "float")]) * 1e3
        int8_ms = statistics.median(seconds[(exporter, "int8")]) * 1e3
        print(f"| {exporter} | {float_ms:.3f} | {int8_ms:.3f} | {int8_ms / float_ms:.2f}x |")


if __name__ == "__main__":
    main()
