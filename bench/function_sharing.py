"""Function count and file size of GPT-2 (12 layers, small width) exported with module
functions, with and without one shared definition for identical bodies, and flat.

    python bench/function_sharing.py [--layers 12] [--width 64]
"""

from __future__ import annotations

import argparse
import collections
import time
import warnings

import torch

import fx2onnx
from fx2onnx.options import ModuleFunctionOptions


def gpt2(layers: int, width: int) -> torch.nn.Module:
    import transformers

    config = transformers.GPT2Config(
        vocab_size=100, n_embd=width, n_layer=layers, n_head=4, n_positions=64, use_cache=False
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def export(model: torch.nn.Module, inputs: dict[str, torch.Tensor], functions: bool | ModuleFunctionOptions) -> tuple[fx2onnx.ONNXProgram, float]:
    start = time.perf_counter()
    options = fx2onnx.ExportOptions(module_functions=functions, failure_report_path=None)
    program = fx2onnx.dynamo_export(model, export_options=options, **inputs)
    return program, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=64)
    arguments = parser.parse_args()
    warnings.filterwarnings("ignore")
    model = gpt2(arguments.layers, arguments.width)
    inputs = {"input_ids": torch.randint(0, 100, (2, 16))}
    rows = [
        ("shared definitions", ModuleFunctionOptions(share_identical=True)),
        ("one per call", ModuleFunctionOptions(share_identical=False)),
        ("flat graph", False),
    ]
    print(f"GPT-2, {arguments.layers} layers, width {arguments.width}")
    print(f"{'':<20}{'functions':>10}{'block defs':>11}{'graph nodes':>12}{'total nodes':>12}{'bytes':>11}{'bytes w/o weights':>18}{'export s':>10}")
    for label, functions in rows:
        program, seconds = export(model, inputs, functions)
        proto = program.model_proto
        size = proto.ByteSize()
        weights = sum(t.ByteSize() for t in proto.graph.initializer)
        blocks = sum(1 for f in proto.functions if f.name.startswith("transformers_models_gpt2_modeling_gpt2_GPT2Block"))
        nodes = len(proto.graph.node) + sum(len(f.node) for f in proto.functions)
        print(f"{label:<20}{len(proto.functions):>10}{blocks:>11}{len(proto.graph.node):>12}{nodes:>12}{size:>11}{size - weights:>18}{seconds:>10.1f}")
        if functions is not False and ModuleFunctionOptions.resolve(functions).share_identical:
            calls = collections.Counter(
                n.op_type for f in [proto.graph, *proto.functions] for n in f.node if n.domain.startswith("pkg.transformers")
            )
            for name, count in sorted(calls.items()):
                if "GPT2Block" in name:
                    print(f"    {name} called {count} times")


if __name__ == "__main__":
    main()
