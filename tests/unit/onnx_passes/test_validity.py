"""Every successful export is a valid model: type legalization, validation, clear errors."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest
import torch

import fx2onnx
from onnxscript import DOUBLE, FLOAT, script
from onnxscript import opset18 as op

from conftest import all_nodes, export_program, make_options


@script()
def bad_relu(x: FLOAT) -> FLOAT:
    return op.Add(x, op.Constant(value_int=1))  # float + int64: an invalid ONNX node


@script()
def double_only_relu(x: DOUBLE) -> DOUBLE:
    return op.Relu(x)


class IntegerOps(torch.nn.Module):
    """Ops whose ONNX counterparts do not accept integers or booleans."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = IntConv()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        flags = x > 4
        return (
            torch.floor(x),
            torch.ceil(x),
            torch.round(x),
            torch.sort(flags, dim=-1).values,
            self.conv(x),
        )


class IntConv(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = torch.arange(6, dtype=x.dtype).reshape(2, 1, 3)
        return torch.nn.functional.conv1d(x.unsqueeze(1), weight)


def test_integer_and_bool_ops_are_legalized_and_match_pytorch(export_and_compare) -> None:
    x = torch.tensor([[3, -7, 2**40 + 1, 5, 0], [9, 1, -2, 8, 6]], dtype=torch.int64)
    small = torch.tensor([[1, -2, 3, 4, 5], [6, 7, -8, 9, 10]], dtype=torch.int64)
    program = export_and_compare(IntegerOps(), (small,), second_inputs=((small * 3,), {}))
    proto = program.model_proto
    # Floor/Ceil/Round on integers are identities (exact above 2**53, unlike a float detour).
    assert not {"Floor", "Ceil", "Round"} & {n.op_type for n in all_nodes(proto)}
    outputs = program(x)
    assert torch.equal(outputs[0], x) and torch.equal(outputs[2], x)
    # The convolution runs in a float type inside the module's function and is cast back.
    conv_function = next(f for f in proto.functions if any(n.op_type == "Conv" for n in f.node))
    casts = [n for n in conv_function.node if n.op_type == "Cast"]
    assert {a.i for n in casts for a in n.attribute} >= {onnx.TensorProto.FLOAT, onnx.TensorProto.INT64}
    notes = [d for d in program.diagnostic_context._diagnostics if d.rule.id == "FXE0021"]
    conv_note = next(d for d in notes if d.properties["op_type"] == "Conv")
    assert "2**24" in conv_note.message and conv_note.properties["from"] == "int64"


def test_bool_topk_and_argmax_are_legalized(export_and_compare) -> None:
    class BoolOps(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            flags = x > 0
            return flags.int().argmax(-1), torch.sort(flags, dim=-1, descending=True).values

    export_and_compare(BoolOps(), (torch.randn(3, 5),))


class RuntimeKernelOps(torch.nn.Module):
    """int64 ops ONNX accepts but ONNX Runtime's CPU provider has no kernel for, and a
    softmax whose dtype argument must be applied before, not after, the computation."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.addmm(a, a, a),
            torch.nn.functional.pixel_shuffle(b, 2),
            torch.nn.functional.max_pool2d(b, 2),
            torch.log_softmax(a, -1, dtype=torch.float32),
            torch.trunc(a),  # torchlib's function body (Floor on int64) is inlined and legalized
            torch.isnan(a),
            torch.isfinite(b),
        )


def test_int64_ops_without_runtime_kernels_match_pytorch(export_and_compare) -> None:
    a = torch.randint(-5, 5, (3, 3))
    b = torch.randint(-50, 50, (1, 4, 2, 2))
    export_and_compare(RuntimeKernelOps(), (a, b), second_inputs=((a * 2, b - 3), {}))


def test_linear_with_int64_input_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(fx2onnx.OnnxExporterError) as raised:
        export_program(torch.nn.Linear(3, 3), (torch.ones(2, 3, dtype=torch.int64),), tmp_path=tmp_path)
    message = str(raised.value)
    assert "FXE0023" in message and "mat1 and mat2 must have the same dtype" in message
    assert "int64" in message and "FX node 'linear'" in message


@pytest.mark.parametrize("returned", ["hello", 3, None, (None, 1.5)])
def test_model_without_tensor_output_is_a_clear_error(tmp_path, returned) -> None:
    class NoTensor(torch.nn.Module):
        def forward(self, x: torch.Tensor):  # noqa: ANN202
            return returned

    with pytest.raises(fx2onnx.OnnxExporterError, match="returns no tensor") as raised:
        export_program(NoTensor(), (torch.ones(2),), tmp_path=tmp_path)
    assert "FXE0023" in str(raised.value)


def test_invalid_model_fails_validation_at_the_node_and_user_line(tmp_path) -> None:
    """A registered function that builds an ill-typed node makes the export fail."""
    registry = fx2onnx.OnnxRegistry()
    registry.register_op(bad_relu, "aten", "relu")

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x) * 2

    with pytest.raises(fx2onnx.OnnxExporterError) as raised:
        export_program(Model(), (torch.randn(3),), options=make_options(tmp_path, onnx_registry=registry), tmp_path=tmp_path)
    message = str(raised.value)
    assert "FXE0022" in message and "relu" in message
    assert "test_validity.py" in message  # the user's line


def test_warnings_reach_the_user_once_per_kind_with_counts(tmp_path) -> None:
    """Two nodes take a nearest-match function (FXE0014): one Python warning says so."""

    class TwoNearMatches(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x) + torch.relu(x * 2)

    registry = fx2onnx.OnnxRegistry()
    registry.remove_op("aten", "relu")
    registry.register_op(double_only_relu, "aten", "relu")
    with pytest.warns(fx2onnx.ExportWarning) as caught:
        program = export_program(
            TwoNearMatches(), (torch.randn(4),), options=make_options(tmp_path, onnx_registry=registry), tmp_path=tmp_path
        )
    ours = [str(w.message) for w in caught if issubclass(w.category, fx2onnx.ExportWarning)]
    assert len(ours) == 1 and "[FXE0014]" in ours[0] and "2 warnings" in ours[0]
    assert "test_validity.py" in ours[0]  # the user's line of the first one
    assert [d.rule.id for d in program.warnings] == ["FXE0014", "FXE0014"]
    assert any(d.rule.id == "FXE0018" and "2x FXE0014" in d.message for d in program.diagnostics)


@script()
def wrong_relu(x: FLOAT) -> FLOAT:
    return op.Abs(x)  # deliberately wrong: |x| instead of max(x, 0)


class PlantedBug(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(self.fc(x))
        z = torch.relu(y - 0.5)  # the planted function makes this line wrong
        return torch.tanh(z) * 2


@pytest.mark.parametrize("module_functions", [False, True])
def test_op_level_debug_finds_a_planted_wrong_function(tmp_path, module_functions: bool) -> None:
    registry = fx2onnx.OnnxRegistry()
    registry.register_op(wrong_relu, "aten", "relu")
    options = make_options(tmp_path, onnx_registry=registry, op_level_debug=True, module_functions=module_functions)
    program = export_program(PlantedBug(), (torch.randn(8, 4),), options=options, tmp_path=tmp_path)
    found = [d for d in program.diagnostics if d.rule.id == "FXE0013" and d.level.name == "WARNING"]
    assert [d.properties["fx_node"] for d in found] == ["relu"]
    (finding,) = found
    assert finding.properties["first_divergence"] and finding.properties["max_difference"] > 0.01
    assert "aten.relu" in finding.message and "float32" in finding.properties["dtypes"]
    assert finding.location is not None and "test_validity.py" in str(finding.location)
    summary = next(d for d in program.diagnostics if d.rule.id == "FXE0013" and d.level.name == "NOTE")
    assert "first diverging node: 'relu'" in summary.message and summary.properties["checked"] >= 4


def test_op_level_debug_reports_nothing_on_a_faithful_model(tmp_path) -> None:
    options = make_options(tmp_path, op_level_debug=True, module_functions=True)
    program = export_program(PlantedBug(), (torch.randn(8, 4),), options=options, tmp_path=tmp_path)
    assert not [d for d in program.diagnostics if d.rule.id == "FXE0013" and d.level.name == "WARNING"]
    summary = next(d for d in program.diagnostics if d.rule.id == "FXE0013" and d.level.name == "NOTE")
    assert "no node diverges" in summary.message and summary.properties["checked"] >= 4


def test_validation_checks_a_copy_without_the_weights(tmp_path) -> None:
    from fx2onnx.onnx_passes.validate_model import weightless_proto

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    program = export_program(model, (torch.randn(3, 64),), tmp_path=tmp_path)
    proto = weightless_proto(program.model)
    # The weights are typed inputs of the checked copy, without data.
    assert {"0.weight", "2.bias"} <= {i.name for i in proto.graph.input}
    assert not proto.graph.initializer
    # The program keeps its weights.
    x = torch.randn(3, 64)
    torch.testing.assert_close(program(x), model(x), rtol=1e-4, atol=1e-5)


def test_onnxruntime_kernel_table_is_reachable() -> None:
    """The private onnxruntime API legalization reads; fails loudly when it moves."""
    from fx2onnx.onnx_passes.cpu_kernel_types import cpu_kernel_types

    assert "tensor(float)" in cpu_kernel_types("Conv", 18, "T")
    assert "tensor(int64)" not in cpu_kernel_types("Gemm", 18, "T")
    assert "tensor(int64)" in cpu_kernel_types("Add", 18, "T")


def test_onnxruntime_operator_schemas_are_reachable() -> None:
    """The private onnxruntime API that types its own kernels' outputs in function bodies;
    fails loudly when it moves."""
    from fx2onnx.onnx_passes.cpu_kernel_types import runtime_output_type

    # an output of the input's type parameter takes the input's type
    assert runtime_output_type("MultiHeadAttention", "com.microsoft", 0, ["tensor(float16)"]) == "tensor(float16)"
    assert runtime_output_type("MatMulNBits", "com.microsoft", 0, ["tensor(float)", "tensor(uint8)"]) == "tensor(float)"
    # nothing known of the input: no answer rather than a guess among several types
    assert runtime_output_type("MultiHeadAttention", "com.microsoft", 0, [None]) is None
    assert runtime_output_type("NoSuchKernel", "com.microsoft", 0, ["tensor(float)"]) is None


def test_an_untyped_runtime_kernel_in_a_function_is_typed_from_its_schema() -> None:
    """A kernel the translation left without an output type (a fused rule's function
    inlined) gets its schema's type, and the Cast that carries it out of the body."""
    from fx2onnx.onnx_passes.unknown_op_types import type_unknown_op_outputs

    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT16), shape=ir.Shape([1, 2, 8]))
    kernel = ir.node("MultiHeadAttention", [x, x, x], {"num_heads": 2}, domain="com.microsoft", name="attention")
    untyped = kernel.outputs[0]
    function = ir.Function("pkg.test", "attention", "", graph=ir.Graph([x], [untyped], nodes=[kernel],
                                                                        opset_imports={"": 20, "com.microsoft": 1}), attributes=[])
    call = ir.node("attention", [ir.Value(name="given")], domain="pkg.test", overload="", name="call")
    model = ir.Model(ir.Graph(list(call.inputs), list(call.outputs), nodes=[call], opset_imports={"": 20, "pkg.test": 1}),
                     ir_version=10, functions=[function])
    assert type_unknown_op_outputs(model) == 1
    assert untyped.dtype == ir.DataType.FLOAT16
    cast = next(node for node in function if node.op_type == "Cast")
    assert cast.attributes["to"].as_int() == ir.DataType.FLOAT16 and function.outputs[0] is cast.outputs[0]
