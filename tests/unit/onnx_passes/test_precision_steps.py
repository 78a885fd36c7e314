"""The precision steps of the ONNX passes chosen by `WeightQuantization`: projections that
read one input packed (`packed_projections`) and an encoder's dynamic int8
(`dynamic_activations`) give what the passes give when run on the finished program."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
import torch

from conftest import assert_valid_model, export_program, make_options
from fx2onnx.onnx_passes import WeightQuantization, pack_projections, quantize_linears_dynamically


class Projections(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(64, n, bias=False) for n in (64, 32, 32))
        self.out = torch.nn.Linear(128, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.cat([self.q(x), self.k(x), self.v(x)], dim=-1))


def _kinds(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(node.op_type for node in model.graph.node)


def test_packed_projections_as_a_step_equal_the_pass_on_the_finished_program(tmp_path):
    torch.manual_seed(0)
    quantization = WeightQuantization(bits=4, accuracy_level=0)
    model = Projections()
    x = torch.randn(2, 3, 64)
    options = make_options(tmp_path, module_functions=False, precision=quantization)
    after = export_program(model, (x,), options=options)
    assert pack_projections(after.model) == 1
    options = make_options(tmp_path, module_functions=False, precision=WeightQuantization(bits=4, accuracy_level=0,
                                                                                           packed_projections=True))
    stepped = export_program(model, (x,), options=options)
    assert_valid_model(stepped)
    kinds = _kinds(stepped.model_proto)
    assert (kinds["MatMulNBits"], kinds["Split"]) == (2, 1) and kinds == _kinds(after.model_proto)
    # the same codes in the same kernel: equal outputs
    np.testing.assert_array_equal(np.asarray(stepped(x)), np.asarray(after(x)))


def test_dynamic_int8_as_a_step_equals_the_pass_on_the_finished_program(tmp_path):
    torch.manual_seed(0)
    model = Projections()
    x = torch.randn(2, 3, 64)
    after = export_program(model, (x,), options=make_options(tmp_path, module_functions=False))
    assert len(quantize_linears_dynamically(after.model).quantized) == 4
    options = make_options(tmp_path, module_functions=False, precision=WeightQuantization(bits=8, dynamic_activations=True))
    stepped = export_program(model, (x,), options=options)
    assert_valid_model(stepped)
    kinds = _kinds(stepped.model_proto)
    assert kinds["MatMulInteger"] == 4 and "MatMulNBits" not in kinds and kinds == _kinds(after.model_proto)
    np.testing.assert_array_equal(np.asarray(stepped(x)), np.asarray(after(x)))


def test_dynamic_activations_are_eight_bits_without_packing():
    with pytest.raises(ValueError, match="give bits=8 and packed_projections=False"):
        WeightQuantization(bits=4, dynamic_activations=True)
    with pytest.raises(ValueError, match="give bits=8 and packed_projections=False"):
        WeightQuantization(bits=8, dynamic_activations=True, packed_projections=True)
