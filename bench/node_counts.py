"""Node counts of fx2onnx's files against torch.onnx.export(..., dynamo=True)'s, and the
leanness checks, on the small models of tests/e2e/runtime_zoo.py.

Each exporter at its default opset (20 for both in torch 2.13), static shapes. For fx2onnx: the default
target's file written with `save(inline_functions=True)` (functions inlined, constants and
batch norm folded) and the portable target's file. Counted: all nodes of the main graph,
and those that are not Constant nodes (torch.onnx keeps its constants as initializers,
fx2onnx's optimizer as Constant nodes: the same values either way); BatchNormalization
after a convolution or linear layer; nodes computable from constants alone; Identity.

    python bench/node_counts.py [--models cnn,bert]
"""

from __future__ import annotations

import argparse
import io
import sys
import warnings
from pathlib import Path

import onnx
import torch

_TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(_TESTS / "e2e"), str(_TESTS)]  # the zoo and its conftest helpers

import fx2onnx  # noqa: E402
from runtime_zoo import ZOO, batch_norms_after_layers, constant_only_nodes, node_count  # noqa: E402


def _torch_onnx(model: torch.nn.Module, kwargs: dict) -> onnx.ModelProto:
    program = torch.onnx.export(model, (), kwargs=kwargs, dynamo=True, verbose=False)
    return program.model_proto


def _fx2onnx_inlined(model: torch.nn.Module, kwargs: dict) -> onnx.ModelProto:
    program = fx2onnx.dynamo_export(model, **kwargs, export_options=fx2onnx.ExportOptions(failure_report_path=None))
    stream = io.BytesIO()
    program.save(stream, inline_functions=True)
    return onnx.load_from_string(stream.getvalue())


def _fx2onnx_portable(model: torch.nn.Module, kwargs: dict) -> onnx.ModelProto:
    options = fx2onnx.ExportOptions(target="portable", failure_report_path=None)
    return fx2onnx.dynamo_export(model, **kwargs, export_options=options).model_proto


def _counts(model: onnx.ModelProto) -> tuple[int, int, int, int, int]:
    constants = sum(node.op_type == "Constant" for node in model.graph.node)
    total = node_count(model)
    identities = sum(node.op_type == "Identity" for node in model.graph.node)
    return total, total - constants, batch_norms_after_layers(model), len(constant_only_nodes(model)), identities


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ZOO), help=f"comma-separated, of {', '.join(ZOO)}")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    print(f"{'model':<18} {'exporter':<20} {'nodes':>6} {'no Const':>8} {'BN':>3} {'const-only':>10} {'Identity':>8}"
          f" {'ratio':>6} {'ratio no Const':>14}")
    for name in args.models.split(","):
        model, kwargs = ZOO[name]()
        results = {}
        for exporter, export in (("torch.onnx", _torch_onnx), ("fx2onnx inlined", _fx2onnx_inlined),
                                 ("fx2onnx portable", _fx2onnx_portable)):
            torch.manual_seed(0)
            results[exporter] = _counts(export(model, kwargs))
        reference = results["torch.onnx"]
        for exporter, counts in results.items():
            print(f"{name:<18} {exporter:<20} {counts[0]:>6} {counts[1]:>8} {counts[2]:>3} {counts[3]:>10} {counts[4]:>8}"
                  f" {counts[0] / reference[0]:>6.2f} {counts[1] / reference[1]:>14.2f}", flush=True)


if __name__ == "__main__":
    main()
