"""float8: casts and float8 weights export as valid models from opset 19 on, follow
PyTorch's overflow rule; the default opset has the types, and an older opset chosen by the
user is a clear error naming the one to use."""

from __future__ import annotations

import os

import onnx
import pytest
import torch
from torch import nn

import fx2onnx
from conftest import all_nodes, make_options, validate_written_reports
from diagnostics import rules
from fx2onnx.onnx_passes.float8 import FLOAT8_OPSET
from fx2onnx.options import DEFAULT_OPSET

FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
# in range, rounded, beyond every float8's range, infinite and NaN: PyTorch's overflow rule
ROUND_TRIP_INPUT = (1.3, -0.07, 300.0, 1000.0, -1e6, 70000.0, float("inf"), float("nan"))


class RoundTrip(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        low = x.to(self.dtype)
        return low.to(torch.float32) * 2, low


def exported_round_trip(tmp_path, dtype: torch.dtype, **options):
    """The float8 round trip exported with ``options``: model, input, program, ModelProto."""
    model, x = RoundTrip(dtype), torch.tensor(ROUND_TRIP_INPUT)
    program = fx2onnx.dynamo_export(model, x, export_options=make_options(tmp_path, **options))
    return model, x, program, program.model_proto


@pytest.mark.parametrize("opset", [19, 23])
@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_float8_casts_match_pytorch_with_overflow(tmp_path, dtype, opset):
    model, x, program, proto = exported_round_trip(tmp_path, dtype, opset_version=opset)
    assert {o.domain: o.version for o in proto.opset_import}[""] == opset
    casts = [n for n in all_nodes(proto) if n.op_type == "Cast" and n.attribute[0].i == {
        torch.float8_e4m3fn: onnx.TensorProto.FLOAT8E4M3FN, torch.float8_e5m2: onnx.TensorProto.FLOAT8E5M2,
        torch.float8_e4m3fnuz: onnx.TensorProto.FLOAT8E4M3FNUZ, torch.float8_e5m2fnuz: onnx.TensorProto.FLOAT8E5M2FNUZ,
    }[dtype]]
    assert casts and all(
        {a.name: a.i for a in n.attribute}["saturate"] == (1 if dtype == torch.float8_e4m3fn else 0) for n in casts
    )
    widened, low = program(x)
    expected_widened, expected_low = model(x)
    assert low.dtype == dtype
    torch.testing.assert_close(widened, expected_widened, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(low.float(), expected_low.float(), equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_float8_at_an_older_opset_names_the_opset_to_use(tmp_path, dtype):
    # an opset chosen by the user stays as chosen: too old for float8 is an error
    with pytest.raises(fx2onnx.OnnxExporterError) as caught:
        fx2onnx.dynamo_export(RoundTrip(dtype), torch.rand(3), export_options=make_options(tmp_path, opset_version=18))
    message = str(caught.value)
    assert "[FXE0022] The model uses float8" in message
    assert "from opset 19 on and this export is at opset 18" in message and "ExportOptions(opset_version=19)" in message
    assert (tmp_path / "r.sarif").is_file()
    validate_written_reports(tmp_path)


class Float8Weights(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", torch.randn(4, 3).to(torch.float8_e4m3fn))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.to(torch.float32)


def test_float8_weights_saved_and_run(tmp_path):
    model = Float8Weights()
    x = torch.randn(2, 4)
    program = fx2onnx.dynamo_export(model, x, export_options=make_options(tmp_path, opset_version=21))
    path = tmp_path / "m.onnx"
    program.save(path, external_data=True)
    onnx.checker.check_model(os.fspath(path), full_check=True)
    weight = next(t for t in onnx.load(os.fspath(path)).graph.initializer if t.name == "weight")
    assert weight.data_type == onnx.TensorProto.FLOAT8E4M3FN
    torch.testing.assert_close(program(x), model(x))


_ONNX_TYPES = {
    torch.float8_e4m3fn: "tensor(float8e4m3fn)", torch.float8_e5m2: "tensor(float8e5m2)",
    torch.float8_e4m3fnuz: "tensor(float8e4m3fnuz)", torch.float8_e5m2fnuz: "tensor(float8e5m2fnuz)",
}


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_the_float8_opset_is_the_first_whose_cast_has_the_type(dtype):
    def cast_types(version: int) -> set[str]:
        schema = onnx.defs.get_schema("Cast", version, "")
        return {t for c in schema.type_constraints if c.type_param_str == "T2" for t in c.allowed_type_strs}

    assert _ONNX_TYPES[dtype] in cast_types(FLOAT8_OPSET)
    assert _ONNX_TYPES[dtype] not in cast_types(FLOAT8_OPSET - 1)


@pytest.mark.parametrize("module_functions", [False, True])
@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_float8_at_the_default_opset_keeps_it(tmp_path, dtype, module_functions):
    # the default opset (20) has the float8 types: the model stays at it, nothing to note
    model, x, program, proto = exported_round_trip(tmp_path, dtype, module_functions=module_functions)
    assert {o.domain: o.version for o in proto.opset_import}[""] == DEFAULT_OPSET > FLOAT8_OPSET
    assert all(f.opset_import[0].version == DEFAULT_OPSET for f in proto.functions if f.opset_import[0].domain == "")
    path = tmp_path / "m.onnx"
    program.save(path)
    onnx.checker.check_model(os.fspath(path), full_check=True)
    assert not [d for d in program.diagnostics if d.rule is rules.TYPE_LEGALIZATION and "float8" in d.message]
    assert not program.diagnostic_context.has_errors()
    torch.testing.assert_close(program(x)[0], model(x)[0], equal_nan=True, rtol=0, atol=0)
    program.save_diagnostics(tmp_path / "float8.sarif")
    validate_written_reports(tmp_path)

    widened, low = program(x)  # onnxruntime against PyTorch, overflow included
    expected_widened, expected_low = model(x)
    assert low.dtype == dtype
    torch.testing.assert_close(widened, expected_widened, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(low.float(), expected_low.float(), equal_nan=True, rtol=0, atol=0)


def test_float8_weights_at_the_default_opset(tmp_path):
    model, x = Float8Weights(), torch.randn(2, 4)
    program = fx2onnx.dynamo_export(model, x, export_options=make_options(tmp_path))
    assert {o.domain: o.version for o in program.model_proto.opset_import}[""] == DEFAULT_OPSET
    onnx.checker.check_model(program.model_proto, full_check=True)
    torch.testing.assert_close(program(x), model(x))
