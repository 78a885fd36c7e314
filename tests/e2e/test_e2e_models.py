"""End-to-end: torch.nn models exported, checked and run in onnxruntime against eager."""

from __future__ import annotations

import torch
from torch import nn

from conftest import MLP


def test_mlp(export_and_compare):
    export_and_compare(MLP(), (torch.randn(3, 8),))


def _cnn() -> nn.Module:
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 5),
    )
    # running statistics that are not the defaults, so BatchNorm(eval) really normalizes
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 1.5)
    return model


def test_cnn_conv_batchnorm_pool(export_and_compare):
    export_and_compare(_cnn(), (torch.randn(2, 3, 16, 16),))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return torch.relu(out + identity)


class SmallResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.layer1 = BasicBlock(8, 8, 1)
        self.layer2 = BasicBlock(8, 16, 2)
        self.layer3 = BasicBlock(16, 32, 2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def test_small_resnet(export_and_compare):
    export_and_compare(SmallResNet(), (torch.randn(2, 3, 32, 32),))


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
        self.gru = nn.GRU(16, 8, batch_first=True)

    def forward(self, x: torch.Tensor):
        y, (h, c) = self.lstm(x)
        z, g = self.gru(y)
        return z, h, c, g


def test_lstm_and_gru_batch_first(export_and_compare):
    export_and_compare(Recurrent(), (torch.randn(2, 5, 8),))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


def test_transformer_encoder(export_and_compare):
    export_and_compare(Encoder(), (torch.randn(2, 6, 16),))


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, query: torch.Tensor, key: torch.Tensor):
        return self.attention(query, key, key)


def test_multihead_attention(export_and_compare):
    export_and_compare(Attention(), (torch.randn(2, 5, 16), torch.randn(2, 7, 16)))


class EmbeddingLayerNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(50, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.embedding(ids))


def test_embedding_layer_norm(export_and_compare):
    export_and_compare(EmbeddingLayerNorm(), (torch.randint(0, 50, (2, 7)),))


# -- capture paths ---------------------------------------------------------------------

import pytest  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

import fx2onnx  # noqa: E402
from conftest import export_program, op_types, translated_fx_targets  # noqa: E402


def test_exported_program_is_taken_as_it_is(export_and_compare):
    model = MLP().eval()
    x = torch.randn(3, 8)
    exported = torch.export.export(model, (x,))
    program = export_and_compare(exported, (x,), eager=model)
    assert {"fc1.weight", "fc2.bias"} <= set(program.model.graph.initializers)


def test_aten_graph_module_from_make_fx(export_and_compare):
    model = MLP().eval()
    x = torch.randn(3, 8)
    graph_module = make_fx(model)(x)
    assert all(
        isinstance(node.target, torch._ops.OpOverload)
        for node in graph_module.graph.nodes
        if node.op == "call_function"
    )
    export_and_compare(graph_module, (x,), eager=model)


def test_plain_function_is_captured(export_and_compare):
    def gelu_residual(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x) + y

    export_and_compare(gelu_residual, (torch.randn(2, 5), torch.randn(2, 5)))


# -- torchlib functions, not decompositions --------------------------------------------


class Norms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.layer_norm = nn.LayerNorm(8)
        self.instance_norm = nn.InstanceNorm2d(4, affine=True)
        self.upsample = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)

    def forward(self, x: torch.Tensor, image: torch.Tensor):
        q = self.layer_norm(self.linear(x)).reshape(2, 2, 3, 4)
        attention = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        upsampled = self.upsample(self.instance_norm(image))
        resized = torch.nn.functional.interpolate(image, size=(5, 7), mode="bilinear", align_corners=True)
        return attention, upsampled, resized


def test_whole_operators_reach_their_torchlib_function(export_and_compare):
    program = export_and_compare(Norms(), (torch.randn(2, 3, 8), torch.randn(1, 4, 6, 6)))
    proto = program.model_proto
    targets = translated_fx_targets(proto)
    for operator in (
        "aten.linear.default",
        "aten.layer_norm.default",
        "aten.scaled_dot_product_attention.default",
        "aten.upsample_bilinear2d.vec",
        "aten.instance_norm.default",
    ):
        assert f"call_function:{operator}" in targets, f"{operator} was decomposed: {sorted(targets)}"
    assert {"Resize", "InstanceNormalization", "LayerNormalization"} <= op_types(proto)


# -- initializer names -----------------------------------------------------------------


def test_initializers_keep_parameter_names(tmp_path):
    model = Encoder()
    with torch.no_grad():  # layers start as copies of one layer; identical weights would be shared
        for parameter in model.parameters():
            parameter.normal_()
    program = export_program(model, (torch.randn(2, 6, 16),), tmp_path=tmp_path)
    names = set(program.model.graph.initializers)
    assert "encoder.layers.0.linear1.weight" in names
    assert "encoder.layers.1.self_attn.in_proj_weight" in names
    assert "encoder.layers.1.norm2.bias" in names
    # weights are graph initializers, never graph inputs
    assert [i.name for i in program.model_proto.graph.input] == ["x"]


def test_buffers_keep_their_names(tmp_path):
    program = export_program(_cnn(), (torch.randn(2, 3, 16, 16),), tmp_path=tmp_path)
    names = set(program.model.graph.initializers)
    assert {"1.running_mean", "1.running_var", "0.weight", "7.bias"} <= names


# -- operators without an ONNX function ------------------------------------------------


@torch.library.custom_op("testlib::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    return x.clone() * 3


@mystery.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class CallsMystery(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        return torch.ops.testlib.mystery(y) + 1  # MYSTERY-LINE


def test_operator_without_onnx_function_is_reported(tmp_path):
    import inspect

    from sarif_checks import validate_sarif

    line = next(
        number
        for number, text in enumerate(inspect.getsource(inspect.getmodule(CallsMystery)).splitlines(), 1)
        if text.rstrip().endswith("# MYSTERY-LINE")
    )
    report = tmp_path / "r.sarif"
    with pytest.raises(fx2onnx.OnnxExporterError) as caught:
        export_program(CallsMystery(), (torch.randn(2, 3),), tmp_path=tmp_path)
    message = str(caught.value)
    assert "testlib::mystery" in message
    assert f"test_e2e_models.py:{line}" in message
    assert report.exists()
    log = validate_sarif(report)
    assert any("testlib::mystery" in result["message"]["text"] for result in log["runs"][0]["results"])
    assert caught.value.onnx_program.diagnostic_context.has_errors()


# -- Python numbers given to trace-only torchlib functions -----------------------------


class ScalarArguments(nn.Module):
    def forward(self, x: torch.Tensor, q: torch.Tensor):
        attention = torch.nn.functional.scaled_dot_product_attention(q, q, q, scale=0.3)
        padded = torch.nn.functional.pad(x, (1, 2), value=0.5)
        upsampled = torch.nn.functional.interpolate(x.unsqueeze(0), scale_factor=2.0, mode="nearest")
        return x.argmax(-1), x.argmin(dim=0, keepdim=True), x.clamp(min=-0.5, max=0.5), attention, padded, upsampled


def test_python_numbers_reach_trace_only_functions(export_and_compare):
    export_and_compare(ScalarArguments(), (torch.randn(3, 4, 5), torch.randn(1, 2, 3, 4)))
