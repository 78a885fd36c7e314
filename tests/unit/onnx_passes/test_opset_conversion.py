"""ExportOptions(opset_version=N): models written at the opset asked for, module functions
kept, equal to PyTorch in onnxruntime; opsets that cannot be written are clear errors."""

from __future__ import annotations

import onnx
import pytest
import torch

import fx2onnx
from conftest import all_nodes, assert_outputs_close, check_saved_model, make_options
from fx2onnx.cli.main import main as cli_main
from fx2onnx.onnx_passes import opset_conversion
from fx2onnx.onnx_passes.opset_conversion import MIN_OPSET, newest_opset
from fx2onnx.options import DEFAULT_OPSET


class ChangedOperators(torch.nn.Module):
    """Operators whose ONNX form changed between opsets 17 and 21: reductions (axes as an
    input in 18), Split (num_outputs in 18), DFT and GridSample (20), and a module function."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.nn.functional.grid_sample(self.norm(x), grid, align_corners=False)
        spectrum = torch.fft.rfft(y, dim=-1).abs().sum(-1)
        first, second = y.chunk(2, dim=1)
        return self.linear(y.mean(dim=1)), spectrum, first.amax(dim=(2, 3)) + second.amin(dim=(2, 3)), y.std(dim=-1)


OPSETS = sorted({MIN_OPSET, 18, 19, 21, 23, newest_opset()})


def _default_opsets(model: onnx.ModelProto) -> set[int]:
    found = {entry.version for entry in model.opset_import if entry.domain == ""}
    for function in model.functions:
        found |= {entry.version for entry in function.opset_import if entry.domain == ""}
    return found


@pytest.mark.parametrize("opset", OPSETS)
def test_changed_operators_at_every_opset(opset, tmp_path):
    torch.manual_seed(0)
    model = ChangedOperators().eval()
    x, grid = torch.randn(2, 4, 8, 8), torch.rand(2, 8, 8, 2) * 2 - 1
    program = fx2onnx.dynamo_export(model, x, grid, export_options=make_options(tmp_path, opset_version=opset))
    proto = onnx.load(check_saved_model(program, tmp_path / "model.onnx"))
    assert _default_opsets(proto) == {opset}
    assert len(proto.functions) == 2  # LayerNorm and Linear stay functions
    assert_outputs_close(program(x, grid), model(x, grid))
    if opset == 17:
        # the reductions take their axes as an attribute again, Split takes sizes
        reductions = [n for n in proto.graph.node if n.op_type in ("ReduceMean", "ReduceMax", "ReduceMin")]
        assert reductions and all(len(n.input) == 1 and any(a.name == "axes" for a in n.attribute) for n in reductions)
        assert all(not any(a.name == "num_outputs" for a in n.attribute) for n in proto.graph.node if n.op_type == "Split")


@pytest.mark.parametrize("opset", [MIN_OPSET, 23])
def test_dynamic_dims_and_functions_at_other_opsets(opset, tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.GELU(), torch.nn.Linear(12, 3)).eval()
    options = make_options(tmp_path, dynamic_shapes=True, opset_version=opset)
    program = fx2onnx.dynamo_export(model, torch.randn(4, 6), export_options=options)
    proto = onnx.load(check_saved_model(program, tmp_path / "model.onnx"))
    assert _default_opsets(proto) == {opset} and len(proto.functions) == 3
    for batch in (1, 7):
        x = torch.randn(batch, 6)
        assert_outputs_close(program(x), model(x))


@pytest.mark.parametrize("module_functions", [False, True])
def test_function_reading_its_call_attributes_converts(module_functions, tmp_path):
    """ReLU6 (torchlib's aten_hardtanh reads min_val and max_val of its call) at opset 23:
    inlined where called, the rest kept."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU6(), torch.nn.Hardtanh(-0.5, 0.25)).eval()
    x = torch.randn(2, 3, 8, 8) * 4
    options = make_options(tmp_path, opset_version=23, module_functions=module_functions)
    program = fx2onnx.dynamo_export(model, x, export_options=options)
    proto = onnx.load(check_saved_model(program, tmp_path / "model.onnx"))
    assert _default_opsets(proto) == {23}
    assert not any(f.name == "aten_hardtanh" for f in proto.functions)
    assert len(proto.functions) == (3 if module_functions else 0)
    assert_outputs_close(program(x), model(x))


def test_default_is_torch_onnx_opset_with_gelu_as_one_operator(tmp_path):
    # torch.onnx.export's default opset too: module functions converted, GELU one Gelu node
    model, x = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.GELU(), torch.nn.GELU(approximate="tanh")), torch.randn(5, 3)
    program = fx2onnx.dynamo_export(model, x, export_options=make_options(None))
    proto = onnx.load(check_saved_model(program, tmp_path / "model.onnx"))
    assert _default_opsets(proto) == {DEFAULT_OPSET} == {20} and proto.functions
    op_types = [node.op_type for node in all_nodes(proto)]
    assert op_types.count("Gelu") == 2 and not {"Erf", "Tanh"} & set(op_types)
    assert_outputs_close(program(x), model(x))


@pytest.mark.parametrize("bad", [16, 0, newest_opset() + 1])
def test_unsupported_opsets_are_refused_before_export(bad):
    with pytest.raises(ValueError, match=rf"opset_version=.* is not supported: give an ONNX opset from {MIN_OPSET} to {newest_opset()}"):
        fx2onnx.dynamo_export(torch.nn.Linear(3, 2), torch.randn(1, 3), export_options=make_options(None, opset_version=bad))


@pytest.mark.parametrize("bad", [True, "18", 18.0])
def test_opsets_of_another_type_are_refused_where_given(bad):
    with pytest.raises(TypeError, match=rf"ExportOptions\(opset_version={bad!r}\): opset_version takes an int or None; got"):
        make_options(None, opset_version=bad)


def test_operator_new_in_18_is_a_clear_error_at_17(tmp_path):
    def bitwise(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bitwise_and(a, b)

    report = tmp_path / "report.sarif"
    options = make_options(None, opset_version=17, failure_report_path=report)
    a = torch.tensor([3, 5, 6])
    with pytest.raises(fx2onnx.OnnxExporterError, match="BitwiseAnd is new in opset 18. Export with opset_version=18 or later"):
        fx2onnx.dynamo_export(bitwise, a, a, export_options=options)
    assert "FXE0022" in report.read_text()
    program = fx2onnx.dynamo_export(bitwise, a, a, export_options=make_options(tmp_path, opset_version=18))
    assert torch.equal(program(a, a), a)


def test_split_of_a_dynamic_dim_is_a_clear_error_at_17(tmp_path):
    def halves(x: torch.Tensor) -> torch.Tensor:
        first, second = x.chunk(2, dim=0)
        return first * second

    options = make_options(tmp_path, opset_version=17, dynamic_shapes={"x": {0: torch.export.Dim("n", min=2) * 2}})
    try:
        program = fx2onnx.dynamo_export(halves, torch.randn(4, 3), export_options=options)
    except fx2onnx.OnnxExporterError as error:
        assert "known only at run time" in str(error) and "opset_version=18" in str(error)
        return
    # torch.export may express the halves as slices of a symbolic size: then they must run
    for rows in (4, 8):
        x = torch.randn(rows, 3)
        assert_outputs_close(program(x), halves(x))


def test_command_line_takes_and_checks_the_opset(tmp_path, capsys):
    output = tmp_path / "demo.onnx"
    assert cli_main(["demo", "--opset", "21", "--output", str(output), "--report", str(tmp_path / "demo.sarif")]) == 0
    assert "opset: 21" in capsys.readouterr().out
    assert _default_opsets(onnx.load(output)) == {21}
    assert cli_main(["demo", "--opset", "16", "--output", str(output)]) == 2
    assert "--opset 16 is not supported" in capsys.readouterr().err


def test_onnxscript_converter_is_where_fx2onnx_reaches_it():
    """Private to onnxscript: this fails loudly when it moves (see opset_conversion)."""
    converter = opset_conversion._converter()
    assert callable(converter.convert_version) and issubclass(converter.VersionConverterError, Exception)
    assert int(converter.SUPPORTED_MAX_ONNX_OPSET) >= 23
