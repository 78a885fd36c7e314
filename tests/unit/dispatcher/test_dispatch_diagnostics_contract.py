"""The dispatch decisions the former `torch.onnx.dynamo_export` recorded, at its levels and
rules, in every report (whatever the verbosity): each SARIF result has text and markdown
naming the FX node's target as torch prints it (`aten.add.Tensor`)."""

from __future__ import annotations

import json

import pytest
import torch

import onnxscript
from onnxscript import opset18 as op

import fx2onnx
from conftest import make_options
from diagnostics import Level, rules


def sarif_results(program_or_context) -> list[dict]:
    context = getattr(program_or_context, "diagnostic_context", program_or_context)
    return [result for run in context.sarif_log()["runs"] for result in run.get("results", [])]


def has_result(context, rule, level: Level, expected_node: str) -> bool:
    return any(
        result["ruleId"] == rule.id
        and result["level"] == level.sarif_level
        and result["message"]["text"]
        and result["message"]["markdown"]
        and expected_node in result["message"]["text"]
        for result in sarif_results(context)
    )


class Clone(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.clone(x, memory_format=torch.preserve_format)


class Add(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.add.Tensor(x, x)


class Mul(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.mul.Tensor(x, x)


def test_perfect_match_is_recorded_at_level_none_by_default(tmp_path):
    program = fx2onnx.dynamo_export(Clone(), torch.tensor(3), export_options=make_options(tmp_path))
    assert has_result(program, rules.FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION, Level.NONE, "aten.clone.default")
    assert not program.diagnostic_context.warnings()


def test_every_node_gets_its_record_even_when_the_choice_is_remembered(tmp_path):
    class Chain(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return ((x + 1) + 2) + 3

    program = fx2onnx.dynamo_export(Chain(), torch.rand(3), export_options=make_options(tmp_path))
    perfect = [r for r in sarif_results(program) if r["ruleId"] == "FXE0014" and "aten.add.Tensor" in r["message"]["text"]]
    assert len(perfect) == 3


@onnxscript.script(onnxscript.values.Opset("pkg.test", 1))
def default_add(self: onnxscript.FLOAT, other: onnxscript.FLOAT) -> onnxscript.FLOAT:
    return op.Add(self, other)


def test_fall_back_to_the_default_overload_is_a_warning(tmp_path):
    registry = fx2onnx.OnnxRegistry()
    registry.remove_op("aten", "add", "Tensor")
    registry.register_op(default_add, "aten", "add")  # only the default overload has a function
    program = fx2onnx.dynamo_export(Add(), torch.rand(3), export_options=make_options(tmp_path, onnx_registry=registry))
    assert has_result(program, rules.FIND_OPERATOR_OVERLOADS_IN_ONNX_REGISTRY, Level.WARNING, "aten.add.Tensor")
    torch.testing.assert_close(program(torch.ones(3)), torch.full((3,), 2.0))


def test_nearest_match_is_a_warning_naming_what_did_not_fit(tmp_path):
    class Var(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.prims.var(x, [0], correction=0.0)

    program = fx2onnx.dynamo_export(Var(), torch.rand(4, 3), export_options=make_options(tmp_path))
    assert has_result(program, rules.FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION, Level.WARNING, "prims.var.default")
    warning = next(d for d in program.diagnostic_context.warnings() if d.rule.id == "FXE0014")
    assert "not a perfect one: attribute 'correction' got float" in warning.message


def test_real_only_function_for_a_complex_input_is_an_error(tmp_path):
    registry = fx2onnx.OnnxRegistry()
    registry.remove_op("aten", "mul", "Tensor", is_complex=True)
    x = torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex64)
    with pytest.raises(fx2onnx.OnnxExporterError) as caught:
        fx2onnx.dynamo_export(Mul(), x, export_options=make_options(tmp_path, onnx_registry=registry))
    context = caught.value.onnx_program.diagnostic_context
    assert has_result(context, rules.NO_SYMBOLIC_FUNCTION_FOR_CALL_FUNCTION, Level.ERROR, "aten.mul.Tensor")


def test_values_inside_module_functions_have_value_info(tmp_path):
    class SubModule(torch.nn.Module):
        def forward(self, x, y, bias):
            return x @ y + bias

    class Module(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.submodule = SubModule()

        def forward(self, x, y, bias):
            return self.submodule(x, y, bias)

    program = fx2onnx.dynamo_export(
        Module(), torch.randn(2, 3), torch.randn(3, 4), torch.randn(4), export_options=make_options(tmp_path, dynamic_shapes=True)
    )
    proto = program.model_proto
    value_info = {vi.name: vi for vi in proto.graph.value_info}
    functions = {(f.domain, f.name): f for f in proto.functions}
    outer = {*(i.name for i in proto.graph.input), *(o.name for o in proto.graph.output), *(t.name for t in proto.graph.initializer)}

    def check(node, function_id: str = "") -> int:
        count = 0
        for output in node.output:
            name = f"{function_id}/{output}" if function_id else output
            if name not in outer:
                assert name in value_info, name
                count += 1
        function = functions.get((node.domain, node.op_type))
        if function is not None:
            for inner in function.node:
                count += check(inner, f"{function.domain}::{function.name}")
        return count

    assert sum(check(node) for node in proto.graph.node) >= 2
    matmul = next(name for name in value_info if name.endswith("/matmul"))
    dims = value_info[matmul].type.tensor_type.shape.dim
    assert dims[0].dim_param and dims[1].dim_param  # symbolic sizes, named


def _saved_results(program, tmp_path, rule) -> list[dict]:
    path = tmp_path / "contract.sarif"
    program.save_diagnostics(path)
    log = json.loads(path.read_text(encoding="utf-8"))
    return [r for run in log["runs"] for r in run.get("results", []) if r["ruleId"] == rule.id]


def test_fall_back_is_recorded_once_per_node_as_fxe0016_warning_in_the_report(tmp_path):
    class AddTwice(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.aten.add.Tensor(torch.ops.aten.add.Tensor(x, x), x)

    registry = fx2onnx.OnnxRegistry()
    registry.remove_op("aten", "add", "Tensor")
    registry.register_op(default_add, "aten", "add")
    program = fx2onnx.dynamo_export(AddTwice(), torch.rand(3), export_options=make_options(tmp_path, onnx_registry=registry))
    fell_back = [d for d in program.diagnostics if d.rule is rules.FIND_OPERATOR_OVERLOADS_IN_ONNX_REGISTRY]
    assert [d.level for d in fell_back] == [Level.WARNING, Level.WARNING]  # the second node's decision is remembered
    assert all(d.properties["used"] == ["aten::add"] and d.properties["target"] == "aten::add.Tensor" for d in fell_back)
    saved = _saved_results(program, tmp_path, rules.FIND_OPERATOR_OVERLOADS_IN_ONNX_REGISTRY)
    assert [r["level"] for r in saved] == ["warning", "warning"]
    x = torch.rand(3)
    torch.testing.assert_close(program(x), 3 * x)  # onnxruntime against PyTorch


def test_nearest_match_names_the_argument_expected_and_got_in_the_report(tmp_path):
    class Var(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.prims.var(x, [0], correction=0.0)

    model, x = Var(), torch.rand(4, 3)
    program = fx2onnx.dynamo_export(model, x, export_options=make_options(tmp_path))
    (nearest,) = [d for d in program.diagnostics if d.rule is rules.FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION]
    assert nearest.level is Level.WARNING
    assert nearest.properties["mismatches"] == [
        {"argument": "correction", "kind": "attribute", "expected": "INT", "got": "float 0.0"}
    ]
    (saved,) = _saved_results(program, tmp_path, rules.FIND_OPSCHEMA_MATCHED_SYMBOLIC_FUNCTION)
    assert saved["level"] == "warning" and saved["properties"]["mismatches"][0]["argument"] == "correction"
    assert "attribute 'correction' got float 0.0 but allows INT" in saved["message"]["text"]
    torch.testing.assert_close(program(x), model(x))


def test_the_analysis_and_the_dispatcher_read_one_decision(tmp_path):
    from dispatcher import DispatchError, OnnxFunctionDispatcher, Refusal
    from diagnostics import DiagnosticContext

    registry = fx2onnx.OnnxRegistry()
    registry.remove_op("aten", "mul", "Tensor", is_complex=True)
    graph_module = torch.export.export(Mul(), (torch.tensor([1 + 2j], dtype=torch.complex64),)).graph_module
    node = next(n for n in graph_module.graph.nodes if n.op == "call_function")
    dispatcher = OnnxFunctionDispatcher(registry, DiagnosticContext("fx2onnx", "test"))
    decision = dispatcher.decide(node)
    assert decision.refusal is Refusal.WRONG_KIND and decision.complex_input and decision.chosen is None
    assert dispatcher.unsupported_reason(node) == decision.reason == "aten::mul.Tensor has no complex implementation"
    with pytest.raises(DispatchError, match="no complex implementation"):
        dispatcher.dispatch(node)
