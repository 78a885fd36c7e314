"""The built-in example: a small transformer exported, verified in onnxruntime, saved."""

from __future__ import annotations

import sys
from pathlib import Path

import torch


class DemoTransformer(torch.nn.Module):
    """A tiny language model: embedding, two encoder layers, and a vocabulary head."""

    def __init__(self, vocab_size: int = 100, d_model: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab_size, d_model)
        layer = torch.nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.encoder(self.embedding(input_ids))))


def demo_model_and_inputs(seed: int = 0) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(seed)
    model = DemoTransformer().eval()
    input_ids = torch.randint(0, 100, (2, 16))
    return model, (input_ids,)


def run_demo(output: Path, report: Path, dynamic: bool, opset: int | None = None) -> int:
    """`fx2onnx demo`: export, save both files, verify in onnxruntime; 0 when it passes."""
    import fx2onnx

    model, inputs = demo_model_and_inputs()
    options = fx2onnx.ExportOptions(dynamic_shapes=dynamic, failure_report_path=report, opset_version=opset)
    try:
        program = fx2onnx.dynamo_export(model, *inputs, export_options=options)
    except fx2onnx.OnnxExporterError as error:
        print(error, file=sys.stderr)
        return 1
    program.save(output)
    program.save_diagnostics(report)

    checks = [inputs]
    if dynamic:  # the exported model must also be right at another batch and length
        checks.append((torch.randint(0, 100, (3, 11)),))
    error = 0.0
    ok = True
    for check in checks:
        with torch.no_grad():
            expected = model(*check)
        actual = program(*check)
        error = max(error, (actual - expected).abs().max().item())
        ok = ok and torch.allclose(actual, expected, rtol=1e-3, atol=1e-4)
    graph = program.model.graph
    print(f"exported {type(model).__name__} to {output} ({output.stat().st_size / 1024:.0f} KiB)")
    print("inputs:  " + ", ".join(_describe(v) for v in graph.inputs))
    print("outputs: " + ", ".join(_describe(v) for v in graph.outputs))
    print(f"opset: {program.model.opset_imports.get('', 18)}, nodes: {len(graph)}, initializers: {len(graph.initializers)}, functions: {len(program.model.functions)}")
    sizes = " and ".join(str(list(check[0].shape)) for check in checks)
    print(f"max abs error vs PyTorch (onnxruntime, inputs {sizes}): {error:.3g}")
    print(f"diagnostics: {report}")
    print("verification: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


def _describe(value) -> str:  # noqa: ANN001 - an onnx_ir value
    dims = ", ".join(str(d) for d in value.shape)
    return f"{value.name} {value.dtype.name}[{dims}]"
