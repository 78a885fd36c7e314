"""float8: casts and float8 weights export as valid models from opset 19 on, follow
PyTorch's overflow rule, and an older opset is a clear error naming the one to use."""

from __future__ import annotations

import os

import onnx
import pytest
import torch
from torch import nn

import fx2onnx
from conftest import all_nodes, make_options, validate_written_reports

FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]


class RoundTrip(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        low = x.to(self.dtype)
        return low.to(torch.float32) * 2, low


@pytest.mark.parametrize("opset", [19, 23])
@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_float8_casts_match_pytorch_with_overflow(tmp_path, dtype, opset):
    model = RoundTrip(dtype)
    x = torch.tensor([1.3, -0.07, 300.0, 1000.0, -1e6, 70000.0, float("inf"), float("nan")])
    program = fx2onnx.dynamo_export(model, x, export_options=make_options(tmp_path, opset_version=opset))
    proto = program.model_proto
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
    with pytest.raises(fx2onnx.OnnxExporterError) as caught:
        fx2onnx.dynamo_export(RoundTrip(dtype), torch.rand(3), export_options=make_options(tmp_path))
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
