"""Dims asked to be dynamic stay dynamic in the ONNX model, or the export says which
input, which dim, and which line of the model fixed it."""

from __future__ import annotations

import json

import onnx_ir as ir
import pytest
import torch
from torch.export import Dim

import fx2onnx
from conftest import MLP, export_program, make_options
from fx2onnx.capture import FIXED_DIM
from fx2onnx.capture.dynamic_dims.switches import keep_size_one_dims_dynamic
from sarif_checks import validate_sarif


def _dims(program: fx2onnx.ONNXProgram, index: int = 0) -> list:
    dims = program.model_proto.graph.input[index].type.tensor_type.shape.dim
    return [d.dim_param or d.dim_value for d in dims]


class BranchOnBatch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + 1
        if x.shape[0] == 4:  # fixes the batch dim
            return y * 2
        return y


@pytest.mark.parametrize("size", [1, 0])
def test_example_batch_of_one_or_zero_stays_dynamic(size: int, export_and_compare, tmp_path) -> None:
    program = export_and_compare(
        MLP(), (torch.randn(size, 8),), options=make_options(tmp_path, dynamic_shapes=True),
        second_inputs=((torch.randn(3, 8),), {}),
    )
    assert _dims(program) == ["x_dim_0", 8]


def test_named_dim_with_example_of_one_stays_dynamic(export_and_compare, tmp_path) -> None:
    options = make_options(tmp_path, dynamic_shapes={"x": {0: Dim("batch")}})
    program = export_and_compare(MLP(), (torch.randn(1, 8),), options=options, second_inputs=((torch.randn(5, 8),), {}))
    assert _dims(program) == ["batch", 8]


def test_fixed_dim_with_dynamic_shapes_true_is_a_warning_naming_dim_and_line(tmp_path) -> None:
    with pytest.warns(UserWarning, match=r"dim 0 of input 'x' was fixed to 4 by the code at .*test_dynamic_dims.py:\d+"):
        program = export_program(BranchOnBatch(), (torch.randn(4, 3),), options=make_options(tmp_path, dynamic_shapes=True))
    assert _dims(program) == [4, "x_dim_1"]
    warnings = [d for d in program.diagnostic_context.warnings() if "fixed to 4" in str(d.message)]
    assert warnings, "the SARIF report must hold the warning"
    # the same in structured form, for code that acts on it (export-hf's dim roles)
    fixed = warnings[0].properties[FIXED_DIM]
    assert (fixed["input"], fixed["dim"], fixed["value"]) == ("x", 0, 4) and "test_dynamic_dims.py:" in fixed["reason"]
    program.save_diagnostics(tmp_path / "export.sarif")
    validate_sarif(tmp_path / "export.sarif")
    report = json.loads((tmp_path / "export.sarif").read_text())
    results = [r for r in report["runs"][0]["results"] if "fixed to 4" in r["message"]["text"]]
    assert results[0]["level"] == "warning"
    location = results[0]["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"].endswith("test_dynamic_dims.py")
    assert location["region"]["startLine"] == BranchOnBatch.forward.__code__.co_firstlineno + 2


class LoopOverTheMasksLength(torch.nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        masked = x * mask  # torch's broadcasting makes the two lengths one
        total = masked.new_zeros(masked.shape[1:])
        for index in range(mask.shape[0]):  # a Python loop: this line fixes the length
            total = total + masked[index]
        return total


def test_a_dim_fixed_through_another_it_equals_names_the_line_that_fixed_it(tmp_path) -> None:
    # x's first guard is torch's (its length equals the mask's); the model's loop then fixes the mask's
    line = LoopOverTheMasksLength.forward.__code__.co_firstlineno + 3
    with pytest.warns(UserWarning, match=rf"dim 0 of input 'x' was fixed to 5 by the code at .*test_dynamic_dims.py:{line}\b"):
        program = export_program(LoopOverTheMasksLength(), (torch.randn(5, 3), torch.ones(5, 1)),
                                 options=make_options(tmp_path, dynamic_shapes=True))
    assert _dims(program)[0] == 5


class GridCells(torch.nn.Module):
    """A grid of one cell per 8 positions (a feature map's size): 1 cell for lengths up to 8."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cells = (x.shape[1] - 1) // 8 + 1
        step = torch.empty((), dtype=torch.int64).fill_(x.shape[1] // cells)
        return torch.arange(0, cells) * step  # broadcast: a 1-cell grid is taken as 1 for good


def test_a_computed_size_taken_as_one_is_a_warning_naming_the_line(export_and_compare, tmp_path) -> None:
    with pytest.warns(UserWarning, match=r"aten.mul.Tensor at .*test_dynamic_dims.py:\d+ took it as 1 for every input"):
        program = export_program(GridCells(), (torch.randn(2, 6),), options=make_options(tmp_path, dynamic_shapes=True))
    (warning,) = [d for d in program.diagnostic_context.warnings() if "took it as 1" in str(d.message)]
    assert warning.location.line == GridCells.forward.__code__.co_firstlineno + 3
    # from an example with 2 cells, the grid's size stays symbolic and nothing is said
    program = export_and_compare(GridCells(), (torch.randn(2, 16),), options=make_options(tmp_path, dynamic_shapes=True),
                                 second_inputs=((torch.randn(3, 40),), {}))
    assert not [d for d in program.diagnostic_context.warnings() if "took it as 1" in str(d.message)]
    assert isinstance(program.model.graph.outputs[0].shape[0], ir.SymbolicDim)


def test_fixed_named_dim_is_an_error_naming_dim_and_line(tmp_path) -> None:
    options = make_options(tmp_path, dynamic_shapes={"x": {0: Dim("batch")}})
    with pytest.raises(fx2onnx.OnnxExporterError, match=r"dim 0 of input 'x' was fixed to 4 by the code at .*test_dynamic_dims.py:\d+"):
        export_program(BranchOnBatch(), (torch.randn(4, 3),), options=options)


def test_dim_index_beyond_the_input_is_an_error(tmp_path) -> None:
    options = make_options(tmp_path, dynamic_shapes={"x": {5: Dim("batch")}})
    with pytest.raises(fx2onnx.OnnxExporterError, match=r"dim 5 of input 'x', which has only 2 dims"):
        export_program(MLP(), (torch.randn(2, 8),), options=options)


def test_unknown_input_name_in_dynamic_shapes_is_an_error(tmp_path) -> None:
    options = make_options(tmp_path, dynamic_shapes={"inputs": {0: Dim("batch")}})
    with pytest.raises(fx2onnx.OnnxExporterError, match=r"dynamic_shapes names \['inputs'\].*inputs are \['x'\]"):
        export_program(MLP(), (torch.randn(2, 8),), options=options)


def test_strict_fallback_is_a_warning_in_summary_and_report(tmp_path, monkeypatch) -> None:
    import fx2onnx.capture.torch_export as capture_module

    real_export = torch.export.export

    def failing_non_strict(*args, strict=False, **kwargs):
        if not strict:
            raise RuntimeError("non-strict capture failed for this test")
        return real_export(*args, strict=strict, **kwargs)

    monkeypatch.setattr(capture_module.torch.export, "export", failing_non_strict)
    with pytest.warns(UserWarning, match="captured in strict mode"):
        program = export_program(MLP(), (torch.randn(2, 8),), options=make_options(tmp_path))
    warnings = [str(d.message) for d in program.diagnostic_context.warnings()]
    assert any("non-strict capture failed for this test" in w and "strict mode" in w for w in warnings)


def test_size_one_switch_is_restored() -> None:
    import torch.fx.experimental._config as shape_config

    before = shape_config.backed_size_oblivious
    with keep_size_one_dims_dynamic():
        assert shape_config.backed_size_oblivious is True
    assert shape_config.backed_size_oblivious == before


def test_sizes_kept_apart_turns_torch_s_duck_shaping_off_and_back() -> None:
    """The switch is torch's private `use_duck_shape`: this fails loudly where it moves."""
    import torch.fx.experimental._config as shape_config

    from fx2onnx.capture import sizes_kept_apart

    assert shape_config.use_duck_shape is True
    with sizes_kept_apart():
        assert shape_config.use_duck_shape is False
    assert shape_config.use_duck_shape is True
