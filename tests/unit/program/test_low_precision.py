"""bfloat16 and float16 models run through ONNXProgram on CPU onnxruntime.

onnxruntime computes float16 models in float16, but has no bfloat16 CPU kernels: a
bfloat16 model runs widened to float32 (its outputs rounded back to bfloat16), so the
bfloat16 tests compare a float32 computation with PyTorch's bfloat16 one."""

from __future__ import annotations

import contextlib

import onnx
import pytest
import torch

from conftest import MLP, export_program


class MixedPrecision(torch.nn.Module):
    """Weights in the model's dtype, a float32 detour and a cast back inside forward."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = MLP()
        self.norm = torch.nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.norm(self.mlp(x))
        return y, torch.softmax(y.float(), -1).to(x.dtype) + 1


# Measured on these inputs (outputs up to 1.8): float16 differs from eager float16 PyTorch by
# 9.8e-4, one float16 ulp (eager is off float64 by 7.0e-4); bfloat16 computed in float32
# differs from eager bfloat16 by 7.8e-3, one bfloat16 ulp (eager is off float64 by 6.1e-3).
# One ulp relative and absolute (2^-10, 2^-7) admits that at any magnitude.
TOLERANCES = {torch.float16: dict(rtol=1e-3, atol=1e-3), torch.bfloat16: dict(rtol=8e-3, atol=8e-3)}


@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, id="bfloat16-computed-in-float32"), pytest.param(torch.float16, id="float16")])
def test_low_precision_model_runs_through_program(dtype: torch.dtype, tmp_path) -> None:
    model = MixedPrecision().to(dtype).eval()
    x = torch.randn(3, 8, dtype=dtype)
    program = export_program(model, (x,), tmp_path=tmp_path)
    elem = onnx.TensorProto.BFLOAT16 if dtype == torch.bfloat16 else onnx.TensorProto.FLOAT16
    assert program.model_proto.graph.output[0].type.tensor_type.elem_type == elem  # the model stays low precision
    # a bfloat16 model says it runs in float32 (onnxruntime's CPU provider lacks the kernels)
    widened = pytest.warns(UserWarning, match="lacks bfloat16 kernels") if dtype == torch.bfloat16 else contextlib.nullcontext()
    with widened:
        actual_first = program(x)
    for inputs in (x, torch.randn(3, 8, dtype=dtype) * 4):
        with torch.no_grad():
            expected = model(inputs)
        actual = actual_first if inputs is x else program(inputs)
        for got, want in zip(actual, expected):
            assert got.dtype == dtype
            torch.testing.assert_close(got.float(), want.float(), **TOLERANCES[dtype])


def test_bfloat16_model_computed_in_float32_from_a_saved_file_with_new_weights(tmp_path) -> None:
    # Weights given at run time go through a saved file with external data; the float32
    # fallback must work on that path too, with the new weights.
    model = MixedPrecision().to(torch.bfloat16).eval()
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    program = export_program(model, (x,), tmp_path=tmp_path)
    other = MixedPrecision().to(torch.bfloat16).eval()
    with torch.no_grad():
        expected = other(x)
        unchanged = model(x)
    with pytest.warns(UserWarning, match="lacks bfloat16 kernels"):
        actual = program(x, model_state=other.state_dict())
    for got, want, old in zip(actual, expected, unchanged):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), **TOLERANCES[torch.bfloat16])
    assert not torch.allclose(actual[0].float(), unchanged[0].float(), **TOLERANCES[torch.bfloat16])  # the new weights were used
