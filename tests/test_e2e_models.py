"""End-to-end: torch.nn models exported, checked and run in onnxruntime against eager."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


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
