"""The quantization's own error (`fx2onnx.hub.shared.quantization_error`): the weights a
folder quantizes read from its initializers' names and shapes, and the float model run
with them rounded as the folder stores them, its float weights back afterwards."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest
import torch

from conftest import dequantize_matmul_nbits
from fx2onnx.hub.shared.quantization_error import rounded_model, stored_weights
from fx2onnx.onnx_passes.nbits_packing import pack_weight

transformers = pytest.importorskip("transformers")


class Tiny(torch.nn.Module):
    """A linear layer, a transformers Conv1D ([in, out]) and a head tied to an embedding."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(10, 48)
        self.proj = torch.nn.Linear(48, 24)
        self.conv = transformers.pytorch_utils.Conv1D(16, 24)  # nf, nx: weight [24 in, 16 out]
        self.head = torch.nn.Linear(48, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        return self.conv(self.proj(hidden)).sum(-1, keepdim=True) + self.head(hidden)


def folder_file(path, weights: dict[str, tuple[torch.Tensor, int, int, bool]]) -> None:
    """An ONNX file holding ``weights`` (name -> [N, K] weight, bits, block size, symmetric) as
    a folder stores them: `<name>_Q<bits>`, `<name>_scales` (and `<name>_zero_points`)."""
    tensors = []
    for name, (weight, bits, block, symmetric) in weights.items():
        packed = pack_weight(weight, bits, block, symmetric)
        tensors += [onnx.numpy_helper.from_array(packed.codes.numpy(), f"{name}_Q{bits}"),
                    onnx.numpy_helper.from_array(packed.scales.numpy(), f"{name}_scales")]
        if packed.zero_points is not None:
            tensors.append(onnx.numpy_helper.from_array(packed.zero_points.numpy(), f"{name}_zero_points"))
    graph = oh.make_graph([oh.make_node("Identity", ["x"], ["y"])], "g", [oh.make_tensor_value_info("x", 1, [1])],
                          [oh.make_tensor_value_info("y", 1, [1])], tensors)
    onnx.save(oh.make_model(graph), str(path))


def test_a_model_runs_with_the_folders_rounding_and_gets_its_float_weights_back(tmp_path):
    model = Tiny().eval()
    float_weights = {name: p.clone() for name, p in model.named_parameters(remove_duplicate=False)}
    stored = {"proj.weight": (model.proj.weight, 4, 32, True), "conv.weight": (model.conv.weight.t(), 8, 16, False),
              "head.weight": (model.head.weight, 4, 64, False)}
    folder_file(tmp_path / "model.onnx", stored)
    weights = sorted(stored_weights([tmp_path / "model.onnx"]), key=lambda w: w.name)
    assert [(w.name, w.bits, w.rows, w.blocks, w.symmetric) for w in weights] == [
        ("conv.weight", 8, 16, 2, False), ("head.weight", 4, 10, 1, False), ("proj.weight", 4, 24, 2, True)]
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        before = model(ids)
        with rounded_model(model, weights) as missing:
            assert missing == []
            # each weight as the folder's codes give it back (its block size found from the count of blocks)
            for name, (weight, bits, block, symmetric) in stored.items():
                packed = pack_weight(weight, bits, block, symmetric)
                zero = None if packed.zero_points is None else packed.zero_points.numpy()
                expected = dequantize_matmul_nbits(packed.codes.numpy(), packed.scales.numpy(), zero, bits, weight.shape[1]).T
                got = model.get_submodule(name.rpartition(".")[0]).weight
                np.testing.assert_array_equal((got.t() if name == "conv.weight" else got).numpy(), expected)
            # the tied embedding reads the float table: only the head is the folder's
            assert torch.equal(model.embed.weight, float_weights["embed.weight"])
            rounded = model(ids)
        after = model(ids)
    assert not torch.equal(rounded, before) and torch.equal(after, before)
    assert all(torch.equal(p, float_weights[name]) for name, p in model.named_parameters(remove_duplicate=False))
    assert model.head.weight is model.embed.weight


def test_a_weight_the_model_does_not_have_is_named(tmp_path):
    model = Tiny().eval()
    folder_file(tmp_path / "model.onnx", {"proj.weight": (model.proj.weight, 4, 32, True),
                                          "packed.qkv.weight": (torch.randn(8, 48), 4, 32, True),
                                          "embed.weight": (torch.randn(7, 48), 4, 32, True)})  # another shape
    with rounded_model(model, stored_weights([tmp_path / "model.onnx"])) as missing:
        assert sorted(missing) == ["embed.weight", "packed.qkv.weight"]
    assert not hasattr(model.proj, "parametrizations")


def test_a_head_tied_to_its_embedding_is_rounded_for_both_unless_the_folder_keeps_the_table(tmp_path):
    # with --quantize-embedding a tied embedding gathers from the head's codes: no float table left
    model = Tiny().eval()
    folder_file(tmp_path / "model.onnx", {"head.weight": (model.head.weight, 4, 32, True)})
    weights = stored_weights([tmp_path / "model.onnx"])
    with rounded_model(model, weights, kept_float=set()):
        assert torch.equal(model.embed.weight, model.head.weight)
        assert not torch.equal(model.embed.weight, model.embed.parametrizations.weight.original)
    with rounded_model(model, weights, kept_float={"head.weight"}):  # the float table under the head's name
        assert hasattr(model.head, "parametrizations") and not hasattr(model.embed, "parametrizations")
    assert model.head.weight is model.embed.weight and not hasattr(model.head, "parametrizations")
