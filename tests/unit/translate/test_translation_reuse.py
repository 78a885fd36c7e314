"""Repeated module calls reuse one translation (fx2onnx.translate.body_key): the file is the one
translating every call gives, calls that differ are translated apart, calls that report
diagnostics report them each, and the progress bar still counts every node."""

from __future__ import annotations

import functools
import io
import logging
import sys

import onnx
import torch
from torch import nn

import fx2onnx
import fx2onnx.translate.translation_steps
from conftest import TerminalStream, assert_outputs_close, assert_valid_model, progress_counters
from diagnostics import DiagnosticOptions, rules
from fx2onnx.translate.body_key import body_key
from fx2onnx.translate.interpreter import FxOnnxInterpreter
from fx2onnx.translate.module_functions import ModuleFunctionTranslator
from fx2onnx.translate.translated_body import BodyInput


class Block(nn.Module):
    def __init__(self, width: int, scale: float = 0.5) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.scale * torch.nn.functional.gelu(self.norm(self.linear(x)))


class Stack(nn.Module):
    def __init__(self, blocks: list[Block]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x.sum(-1)


def _export(model: nn.Module, x: torch.Tensor, monkeypatch, reuse: bool, **options) -> tuple[fx2onnx.ONNXProgram, list[str]]:
    """Export; also returns the names of the graphs the interpreter translated."""
    translated: list[str] = []
    original = FxOnnxInterpreter.translate

    def counting(self, graph_module, builder, **kwargs):
        translated.append(builder.graph.name)
        return original(self, graph_module, builder, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(FxOnnxInterpreter, "translate", counting)
        patch.setattr(fx2onnx.translate.translation_steps, "ModuleFunctionTranslator", functools.partial(ModuleFunctionTranslator, reuse_translations=reuse))
        options.setdefault("failure_report_path", None)
        program = fx2onnx.dynamo_export(model.eval(), x, export_options=fx2onnx.ExportOptions(**options))
    return program, translated


def _file(program: fx2onnx.ONNXProgram, path) -> bytes:
    program.save(path)
    return onnx.load(str(path), load_external_data=False).SerializeToString()


def _check_against_eager(program: fx2onnx.ONNXProgram, model: nn.Module, x: torch.Tensor) -> None:
    assert_valid_model(program)
    with torch.no_grad():
        assert_outputs_close(program(x), model(x))


def test_repeated_layers_are_translated_once_into_the_same_file(monkeypatch, tmp_path) -> None:
    model, x = Stack([Block(8) for _ in range(4)]), torch.randn(2, 3, 8)
    reused, translated_once = _export(model, x, monkeypatch, reuse=True)
    each, translated_each = _export(model, x, monkeypatch, reuse=False)
    # main graph + Block, Linear, LayerNorm bodies once; without reuse 4 times each
    assert len(translated_once) == 1 + 3
    assert len(translated_each) == 1 + 4 * 3
    assert _file(reused, tmp_path / "reused.onnx") == _file(each, tmp_path / "each.onnx")
    calls = [node for node in reused.model_proto.graph.node if "Block" in node.op_type]
    assert len(calls) == 4 and len({node.op_type for node in calls}) == 1
    assert len({node.output[0] for node in calls}) == 4
    _check_against_eager(reused, model, x)


def test_layers_that_differ_are_translated_apart(monkeypatch, tmp_path) -> None:
    # the same code, but a different constant (scale) or width: no translation fits another
    blocks = [Block(8, 0.5), Block(8, 0.5), Block(8, 2.0), Block(8, 0.5)]
    model, x = Stack(blocks), torch.randn(2, 3, 8)
    reused, translated = _export(model, x, monkeypatch, reuse=True)
    each, _ = _export(model, x, monkeypatch, reuse=False)
    # two Block bodies (scale 0.5 and 2.0); the second one's Linear and LayerNorm calls
    # are the first one's again
    assert [name.split("_Block_")[-1] for name in translated if "_Block_" in name] == ["blocks_0", "blocks_2"]
    assert len(translated) == 1 + 2 + 2
    assert _file(reused, tmp_path / "reused.onnx") == _file(each, tmp_path / "each.onnx")
    block_functions = {f.name for f in reused.model_proto.functions if "Block" in f.name}
    assert len(block_functions) == 2
    _check_against_eager(reused, model, x)

    class Widening(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([Block(8), Block(8)])
            self.middle = nn.Linear(8, 16)
            self.wide = Block(16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.wide(self.middle(self.blocks[1](self.blocks[0](x))))

    model = Widening()
    program, translated = _export(model, x, monkeypatch, reuse=True)
    assert len([name for name in translated if "Block" in name]) == 2  # width 8 once, width 16
    _check_against_eager(program, model, x)


def test_translations_that_report_diagnostics_are_not_reused(monkeypatch) -> None:
    # at DEBUG verbosity every FX node records its own diagnostic: every call is translated
    model, x = Stack([Block(8) for _ in range(3)]), torch.randn(2, 8)
    options = {"diagnostic_options": DiagnosticOptions(verbosity_level=logging.DEBUG)}
    program, translated = _export(model, x, monkeypatch, reuse=True, **options)
    assert len(translated) == 1 + 3 * 3
    per_node = [d for d in program.diagnostic_context.diagnostics if d.rule == rules.FX_NODE_TO_ONNX]
    linear_calls = [d for d in per_node if "aten.linear" in str(d.properties) or "aten.linear" in d.message]
    assert len(linear_calls) == 3, [d.message for d in per_node][:5]
    _check_against_eager(program, model, x)


def test_progress_counts_the_nodes_of_reused_translations(monkeypatch) -> None:
    terminal = TerminalStream()
    monkeypatch.setattr(sys, "stderr", terminal)
    model, x = Stack([Block(8) for _ in range(6)]), torch.randn(2, 8)
    _export(model, x, monkeypatch, reuse=True, progress=True)
    done, total = progress_counters(terminal.getvalue())[-1]
    assert total > 6 * 10 and done == total


def test_body_key_sees_types_and_constants_not_names() -> None:
    graphs = {}

    class Capture(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.relu(x) * 3 + y

    for name, dtype in (("first", torch.float32), ("second", torch.float32), ("double", torch.float64)):
        graph_module = torch.export.export(Capture(), (torch.randn(2, 3, dtype=dtype), torch.randn(2, 3, dtype=dtype))).graph_module
        for node in graph_module.graph.nodes:  # other names, same structure
            node.name = f"{name}_{node.name}"
        graphs[name] = graph_module
    keys = {name: body_key(graph_module, {}, "pkg.test") for name, graph_module in graphs.items()}
    assert keys["first"] == keys["second"]
    assert keys["first"] != keys["double"]
    assert body_key(graphs["first"], {}, "pkg.other") != keys["first"]
    placeholder = next(iter(graphs["first"].graph.find_nodes(op="placeholder")))
    assert body_key(graphs["first"], {placeholder.name: 2.0}, "pkg.test") != body_key(graphs["first"], {placeholder.name: 3.0}, "pkg.test")
    assert body_key(graphs["first"], {placeholder.name: BodyInput()}, "pkg.test") == keys["first"]
    assert body_key(graphs["first"], {placeholder.name: object()}, "pkg.test") is None  # not describable: no reuse
    graphs["first"].register_buffer("table", torch.ones(3))
    with graphs["first"].graph.inserting_before(placeholder.next):
        graphs["first"].graph.get_attr("table")
    assert body_key(graphs["first"], {}, "pkg.test") is None  # a tensor read by get_attr: no reuse
