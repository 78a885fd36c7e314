"""Exporting the same model twice writes byte-identical files."""

from __future__ import annotations

import pytest
import torch

import fx2onnx


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.gelu(self.linear(self.norm(x)))


class _Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(3))
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).softmax(-1)


@pytest.mark.parametrize("optimize", [True, False])
def test_reexport_writes_identical_bytes(tmp_path, optimize):
    model, x = _Stack().eval(), torch.randn(2, 5, 8)
    paths = []
    for index in range(2):
        options = fx2onnx.ExportOptions(optimize=optimize, failure_report_path=None)
        program = fx2onnx.dynamo_export(model, x, export_options=options)
        path = tmp_path / f"m{index}.onnx"
        program.save(path)
        paths.append(path)
    first, second = (p.read_bytes() for p in paths)
    assert len(first) > 1000
    assert first == second
    torch.testing.assert_close(program(x), model(x), rtol=1e-4, atol=1e-5)


def test_reexport_of_a_transformers_model_writes_identical_bytes(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16, use_cache=False)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 100, (1, 6))
    contents = []
    for index in range(2):
        path = tmp_path / f"gpt2_{index}.onnx"
        fx2onnx.dynamo_export(model, ids, export_options=fx2onnx.ExportOptions(failure_report_path=None)).save(path)
        contents.append(path.read_bytes())
    assert contents[0] == contents[1]
