"""What onnxruntime's own tools change on fx2onnx's files and on torch.onnx's.

The same models (a BERT encoder, a LLaMA decoder, a small CNN; random weights, nothing
downloaded) are exported by fx2onnx (flat graph: `module_functions=False`, what
`export-hf` folders are) and by `torch.onnx.export(..., dynamo=True)`; then each tool runs
on both files and the table counts what it made:

- `quantize_dynamic` (int8 weights, dynamic activations): MatMulInteger / ConvInteger nodes;
- `MatMulNBitsQuantizer` (int4, block 32, symmetric, accuracy level 4): MatMulNBits nodes;
- the transformers optimizer (`onnxruntime.transformers.optimizer`, model type bert or
  gpt2 where it applies): fused nodes it reports (Attention, SkipLayerNormalization, ...);
- `quantize_static` (QDQ, calibrated on the example): QuantizeLinear nodes;

and the latency of each quantized file relative to its float file (median of N runs in
one process, both exporters interleaved).

    python bench/ecosystem_tools.py [--runs 20]
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

import fx2onnx


def bert() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    config = transformers.BertConfig(vocab_size=1000, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                                     num_attention_heads=4)
    ids = torch.randint(0, 1000, (1, 64))
    return transformers.BertModel(config).eval(), (ids, torch.ones_like(ids))


def llama() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=4, use_cache=False)
    return transformers.LlamaForCausalLM(config).eval(), (torch.randint(0, 1000, (1, 64)),)


def cnn() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    layers = [torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(),
              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10)]
    return torch.nn.Sequential(*layers).eval(), (torch.randn(1, 3, 64, 64),)


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]] = {"BERT": bert, "LLaMA": llama, "CNN": cnn}
OPTIMIZER_TYPES = {"BERT": "bert", "LLaMA": "gpt2"}


def export_both(model: torch.nn.Module, args: tuple[torch.Tensor, ...], folder: Path) -> dict[str, Path]:
    files = {"fx2onnx": folder / "fx2onnx.onnx", "torch.onnx": folder / "torch_onnx.onnx"}
    options = fx2onnx.ExportOptions(module_functions=False, failure_report_path=None)
    fx2onnx.dynamo_export(model, *args, export_options=options).save(files["fx2onnx"])
    torch.onnx.export(model, args, os.fspath(files["torch.onnx"]), dynamo=True, verbose=False)
    return files


def count(path: Path, *kinds: str) -> int:
    model = onnx.load(os.fspath(path), load_external_data=False)
    return sum(node.op_type in kinds for node in model.graph.node)


def feeds(path: Path, args: tuple[torch.Tensor, ...]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    return {value.name: arg.numpy() for value, arg in zip(session.get_inputs(), args)}


def median_seconds(runner: ort.InferenceSession, feed: dict[str, np.ndarray], runs: int) -> float:
    """The median time of ``runs`` runs of ``runner`` on ``feed``, after one warm-up run."""
    runner.run(None, feed)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        runner.run(None, feed)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def latency(path: Path, inputs: dict[str, np.ndarray], runs: int) -> float:
    return median_seconds(ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"]), inputs, runs)


def run_tools(name: str, path: Path, args: tuple[torch.Tensor, ...], runs: int) -> dict[str, str]:
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    row: dict[str, str] = {}
    inputs = feeds(path, args)
    float_time = latency(path, inputs, runs)
    dynamic = path.with_suffix(".int8.onnx")
    quantize_dynamic(os.fspath(path), os.fspath(dynamic), weight_type=QuantType.QInt8)
    row["quantize_dynamic"] = (f"{count(dynamic, 'MatMulInteger', 'ConvInteger')} int8 nodes, "
                               f"{latency(dynamic, inputs, runs) / float_time:.2f}x")
    quantizer = MatMulNBitsQuantizer(onnx.load(os.fspath(path)), bits=4, block_size=32, is_symmetric=True, accuracy_level=4)
    quantizer.process()
    nbits = path.with_suffix(".int4.onnx")
    quantizer.model.save_model_to_file(os.fspath(nbits), use_external_data_format=True)
    row["MatMulNBits"] = f"{count(nbits, 'MatMulNBits')} nodes, {latency(nbits, inputs, runs) / float_time:.2f}x"

    class OneExample(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter([inputs])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.items, None)

    static = path.with_suffix(".qdq.onnx")
    quantize_static(os.fspath(path), os.fspath(static), OneExample())
    row["quantize_static"] = f"{count(static, 'QuantizeLinear')} QuantizeLinear"
    if name in OPTIMIZER_TYPES:
        from onnxruntime.transformers import optimizer

        optimized = optimizer.optimize_model(os.fspath(path), model_type=OPTIMIZER_TYPES[name], opt_level=0)
        fused = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
        row["transformers optimizer"] = ", ".join(f"{k} {v}" for k, v in sorted(fused.items())) or "nothing fused"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    arguments = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, onnxruntime {ort.__version__}, onnx {onnx.__version__}")
    with tempfile.TemporaryDirectory() as temp:
        for name, make in MODELS.items():
            model, args = make()
            folder = Path(temp) / name
            folder.mkdir()
            files = export_both(model, args, folder)
            rows = {exporter: run_tools(name, path, args, arguments.runs) for exporter, path in files.items()}
            print(f"\n{name}")
            tools = list(collections.OrderedDict.fromkeys(t for row in rows.values() for t in row))
            print(f"| tool | {' | '.join(rows)} |\n|---|{'---|' * len(rows)}")
            for tool in tools:
                print(f"| {tool} | {' | '.join(row.get(tool, '') for row in rows.values())} |")


if __name__ == "__main__":
    main()
