"""End-to-end: dynamic shapes, readable symbolic dim names, SymInt arithmetic."""

from __future__ import annotations

import re

import onnx
import pytest
import torch
from torch import nn
from torch.export import Dim

import fx2onnx
from conftest import MLP, make_options

transformers = pytest.importorskip("transformers")

_TORCH_SYMBOL = re.compile(r"\bs\d+\b")


def input_dims(model: onnx.ModelProto, index: int = 0) -> list[int | str]:
    dims = model.graph.input[index].type.tensor_type.shape.dim
    return [d.dim_param if d.HasField("dim_param") else d.dim_value for d in dims]


def output_dims(model: onnx.ModelProto, index: int = 0) -> list[int | str]:
    dims = model.graph.output[index].type.tensor_type.shape.dim
    return [d.dim_param if d.HasField("dim_param") else d.dim_value for d in dims]


def assert_no_torch_symbols(model: onnx.ModelProto) -> None:
    for value in [*model.graph.input, *model.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            assert not _TORCH_SYMBOL.search(dim.dim_param), f"{value.name}: torch symbol {dim.dim_param!r} in ONNX"


def test_mlp_all_dims_dynamic(export_and_compare, tmp_path):
    program = export_and_compare(
        MLP(), (torch.randn(3, 8),), options=make_options(tmp_path, dynamic_shapes=True),
        second_inputs=((torch.randn(7, 8),), {}),
    )
    proto = program.model_proto
    assert input_dims(proto) == ["x_dim_0", 8]
    assert output_dims(proto) == ["x_dim_0", 4]
    assert_no_torch_symbols(proto)


def test_mlp_with_dim_spec(export_and_compare, tmp_path):
    spec = {"x": {0: Dim("batch", min=1, max=64)}}
    program = export_and_compare(
        MLP(), (torch.randn(3, 8),), options=make_options(tmp_path, dynamic_shapes=spec),
        second_inputs=((torch.randn(5, 8),), {}),
    )
    proto = program.model_proto
    assert input_dims(proto) == ["batch", 8]
    assert output_dims(proto) == ["batch", 4]


def test_mlp_with_positional_dim_spec(export_and_compare, tmp_path):
    spec = ({0: Dim("batch")},)
    program = export_and_compare(
        MLP(), (torch.randn(3, 8),), options=make_options(tmp_path, dynamic_shapes=spec),
        second_inputs=((torch.randn(6, 8),), {}),
    )
    assert input_dims(program.model_proto) == ["batch", 8]


def _gpt2() -> nn.Module:
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, use_cache=False)
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.mark.slow
def test_gpt2_all_dims_dynamic(export_and_compare, tmp_path):
    program = export_and_compare(
        _gpt2(), kwargs={"input_ids": torch.randint(0, 100, (2, 8))},
        options=make_options(tmp_path, dynamic_shapes=True),
        second_inputs=((), {"input_ids": torch.randint(0, 100, (3, 11))}),
    )
    proto = program.model_proto
    assert input_dims(proto) == ["input_ids_dim_0", "input_ids_dim_1"]
    assert_no_torch_symbols(proto)


@pytest.mark.slow
def test_gpt2_with_dim_spec(export_and_compare, tmp_path):
    spec = {"input_ids": {0: Dim("batch", max=16), 1: Dim("sequence", max=64)}}
    program = export_and_compare(
        _gpt2(), kwargs={"input_ids": torch.randint(0, 100, (2, 8))},
        options=make_options(tmp_path, dynamic_shapes=spec),
        second_inputs=((), {"input_ids": torch.randint(0, 100, (3, 11))}),
    )
    proto = program.model_proto
    assert input_dims(proto) == ["batch", "sequence"]
    assert output_dims(proto)[:2] == ["batch", "sequence"]
    assert_no_torch_symbols(proto)


class SymIntArithmetic(nn.Module):
    def forward(self, x: torch.Tensor):
        flat = x.reshape(x.size(0) * x.size(1), -1)
        zeros = x.new_zeros(x.size(0))
        positions = torch.arange(x.size(1))
        return flat, zeros, positions


def test_symint_arithmetic(export_and_compare, tmp_path):
    program = export_and_compare(
        SymIntArithmetic(), (torch.randn(3, 4, 5),), options=make_options(tmp_path, dynamic_shapes=True),
        second_inputs=((torch.randn(4, 6, 5),), {}),
    )
    proto = program.model_proto
    assert input_dims(proto) == ["x_dim_0", "x_dim_1", "x_dim_2"]
    assert output_dims(proto, 1) == ["x_dim_0"]
    assert output_dims(proto, 2) == ["x_dim_1"]
    assert_no_torch_symbols(proto)


class SizeAsScalar(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.shape[0] + x.size(1)


def test_size_used_as_a_number(export_and_compare, tmp_path):
    export_and_compare(
        SizeAsScalar(), (torch.randn(3, 4),), options=make_options(tmp_path, dynamic_shapes=True),
        second_inputs=((torch.randn(5, 2),), {}),
    )


def test_static_export_has_no_symbolic_dims(export_and_compare):
    program = export_and_compare(MLP(), (torch.randn(3, 8),))
    assert input_dims(program.model_proto) == [3, 8]


def test_symbolic_make_fx_graph_keeps_its_symbolic_sizes(export_and_compare):
    from torch.fx.experimental.proxy_tensor import make_fx

    def model(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w).sum(-1)

    w = torch.randn(8, 4)
    graph_module = make_fx(model, tracing_mode="symbolic")(torch.randn(3, 8), w)
    program = export_and_compare(
        graph_module, (torch.randn(3, 8), w), eager=model, second_inputs=((torch.randn(6, 8), w), {})
    )
    dims = input_dims(program.model_proto)
    assert isinstance(dims[0], str) and dims[0].endswith("_dim_0")
    assert_no_torch_symbols(program.model_proto)


def test_returned_size_is_a_python_int_at_every_shape(tmp_path):
    class SizeAndSum(nn.Module):
        def forward(self, x: torch.Tensor):
            return x.sum(), x.shape[0] * 2

    program = fx2onnx.dynamo_export(SizeAndSum(), torch.randn(3, 4), export_options=make_options(tmp_path, dynamic_shapes=True))
    for rows in (3, 7):
        x = torch.randn(rows, 4)
        total, doubled = program(x)
        assert doubled == rows * 2 and type(doubled) is int
        torch.testing.assert_close(total, x.sum())


class KeywordInputs(nn.Module):
    """A forward whose tensors arrive in **kwargs, as many libraries write it."""

    def forward(self, x: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        return x * kwargs["scale"] + kwargs["bias"].mean(-1, keepdim=True)


@pytest.mark.parametrize(
    "spec",
    [
        True,
        {"x": {0: Dim("batch")}, "bias": {0: Dim("batch"), 1: Dim("width")}},  # the capture's form
        {"x": {0: Dim("batch")}, "kwargs": {"bias": {0: Dim("batch"), 1: Dim("width")}}},  # torch.export's form
    ],
    ids=["all-dynamic", "named", "named-in-kwargs"],
)
def test_keyword_tensors_in_var_keyword_stay_dynamic(export_and_compare, tmp_path, spec):
    inputs = {"scale": torch.tensor(0.5), "bias": torch.randn(3, 5)}
    program = export_and_compare(
        KeywordInputs(), (torch.randn(3, 4),), inputs, options=make_options(tmp_path, dynamic_shapes=spec),
        second_inputs=((torch.randn(6, 4),), {"scale": torch.tensor(2.0), "bias": torch.randn(6, 9)}),
    )
    proto = program.model_proto
    assert [value.name for value in proto.graph.input] == ["x", "scale", "bias"]
    bias_dims = input_dims(proto, 2)
    assert all(isinstance(dim, str) for dim in bias_dims)
    if spec is not True:
        assert input_dims(proto, 0)[0] == bias_dims[0] == "batch" and bias_dims[1] == "width"
    assert_no_torch_symbols(proto)


def test_spec_naming_an_input_not_given_is_an_error(tmp_path):
    spec = {"x": {0: Dim("batch")}, "kwargs": {"shift": {0: Dim("batch")}}}
    with pytest.raises(fx2onnx.OnnxExporterError, match=r"names \['shift'\]"):
        fx2onnx.dynamo_export(
            KeywordInputs(), torch.randn(3, 4), scale=torch.tensor(0.5), bias=torch.randn(3, 5),
            export_options=make_options(tmp_path, dynamic_shapes=spec),
        )
