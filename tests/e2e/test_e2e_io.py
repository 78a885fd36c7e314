"""End-to-end: nested inputs and outputs, None, Python scalars, wrong input structures."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fx2onnx
from conftest import assert_outputs_close, export_program


class Nested(nn.Module):
    def forward(self, mapping, pair, items, nothing=None):
        first = mapping["a"] + pair[0]
        return {"sum": first, "rest": [items[0] * 2, (pair[1][0] - mapping["b"],)]}, None


def _nested_inputs():
    return (
        {"a": torch.randn(3), "b": torch.randn(3)},
        (torch.randn(3), (torch.randn(3),)),
        [torch.randn(2)],
        None,
    )


def test_nested_inputs_and_outputs(export_and_compare):
    program = export_and_compare(Nested(), _nested_inputs(), second_inputs=(_nested_inputs(), {}))
    result = program(*_nested_inputs())
    assert isinstance(result, tuple) and result[1] is None
    assert set(result[0]) == {"sum", "rest"}
    assert isinstance(result[0]["rest"], list) and isinstance(result[0]["rest"][1], tuple)
    # None leaves are not ONNX inputs
    assert len(program.adapt_torch_inputs_to_onnx(*_nested_inputs())) == 5


class KeywordInputs(nn.Module):
    def forward(self, x, *, scale=None, bias=None):
        y = x if scale is None else x * scale
        return y if bias is None else y + bias


def test_keyword_inputs_with_none(export_and_compare):
    x, bias = torch.randn(2, 3), torch.randn(3)
    export_and_compare(KeywordInputs(), (x,), {"scale": None, "bias": bias})


class ScaleBy(nn.Module):
    def forward(self, x: torch.Tensor, factor: float) -> torch.Tensor:
        return x * factor


def test_python_scalar_is_specialized_and_user_is_told(tmp_path):
    x = torch.randn(2, 3)
    with pytest.warns(UserWarning, match=r"factor.*baked into the ONNX graph"):
        program = export_program(ScaleBy(), (x, 2.5), tmp_path=tmp_path)
    assert len(program.model_proto.graph.input) == 1
    assert_outputs_close(program(x, 2.5), x * 2.5)
    with pytest.raises(fx2onnx.UnsupportedInputError, match=r"specialized to 2\.5.*3\.0 was given"):
        program(x, 3.0)


def test_wrong_nested_structure_is_a_clear_error(tmp_path):
    program = export_program(Nested(), _nested_inputs(), tmp_path=tmp_path)
    mapping, pair, items, nothing = _nested_inputs()
    # a list where a tuple was exported, a dict with another key, a missing leaf
    with pytest.raises(fx2onnx.UnsupportedInputError, match="incompatible with the format that was exported"):
        program(mapping, list(pair), items, nothing)
    with pytest.raises(fx2onnx.UnsupportedInputError, match="incompatible with the format that was exported"):
        program({"a": mapping["a"], "c": mapping["b"]}, pair, items, nothing)
    with pytest.raises(fx2onnx.UnsupportedInputError, match="incompatible with the format that was exported"):
        program(mapping, pair, [], nothing)


def test_wrong_keyword_arguments_are_a_clear_error(tmp_path):
    x, bias = torch.randn(2, 3), torch.randn(3)
    program = export_program(KeywordInputs(), (x,), {"bias": bias}, tmp_path=tmp_path)
    with pytest.raises(fx2onnx.UnsupportedInputError, match=r"keyword arguments \[\] were given.*\['bias'\]"):
        program(x)


def test_wrong_number_of_positional_inputs_is_a_clear_error(tmp_path):
    with pytest.warns(UserWarning, match="factor"):
        program = export_program(ScaleBy(), (torch.randn(2, 3), 2.0), tmp_path=tmp_path)
    with pytest.raises(fx2onnx.UnsupportedInputError, match=r"exported: args=\(\*, \*\).*\n.*given: +args=\(\*\)"):
        program(torch.randn(2, 3))


class TensorAndInt(nn.Module):
    def forward(self, x: torch.Tensor, repeat: int, flag: bool):
        return x.repeat(repeat, 1) if flag else x


def test_int_and_bool_scalars_are_specialized(tmp_path):
    x = torch.randn(2, 3)
    with pytest.warns(UserWarning, match=r"'(repeat|flag)'") as caught:
        program = export_program(TensorAndInt(), (x, 2, True), tmp_path=tmp_path)
    assert any("'flag'" in str(w.message) for w in caught)
    assert_outputs_close(program(x, 2, True), x.repeat(2, 1))
    with pytest.raises(fx2onnx.UnsupportedInputError, match="flag"):
        program(x, 2, False)


class BFloat16InAndOut(nn.Module):
    def forward(self, half: torch.Tensor, x: torch.Tensor):
        return half.float() * x, x.bfloat16()


def test_bfloat16_inputs_and_outputs_cross_onnxruntime(export_and_compare):
    """numpy has no bfloat16: such tensors reach onnxruntime and come back through DLPack."""
    half = torch.randn(2, 3).bfloat16()
    program = export_and_compare(BFloat16InAndOut(), (half, torch.randn(2, 3)))
    product, converted = program(half, torch.ones(2, 3))
    assert converted.dtype == torch.bfloat16
    torch.testing.assert_close(product, half.float())


class MixedPythonNumbers(nn.Module):
    def forward(self, x: torch.Tensor):
        # one op, two Python numbers of different kinds for the same ONNX type
        return torch.where(x > 0, 0, float("-inf")), torch.special.entr(x)


def test_python_numbers_of_mixed_kinds_share_one_type(export_and_compare):
    x = torch.tensor([[-1.0, 0.0, 0.5], [2.0, 1.0, -0.25]])
    export_and_compare(MixedPythonNumbers(), (x,))
