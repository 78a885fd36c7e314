"""Every convolution kind and dimension, with and without bias, grouped, dilated, strided,
padded by ints or by "same"/"valid", batched or not: the exported model runs in
onnxruntime and matches PyTorch. A bias-free convolution is a `Conv` with two inputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import all_nodes

CONVOLUTIONS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
TRANSPOSED = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}
OPTIONS = {
    "plain": dict(kernel_size=3),
    "grouped": dict(kernel_size=3, groups=2),
    "dilated": dict(kernel_size=3, dilation=2, padding=2),
    "strided": dict(kernel_size=2, stride=2, padding=1),
    "same": dict(kernel_size=4, padding="same", dilation=2),
    "valid": dict(kernel_size=3, padding="valid"),
    "depthwise": dict(kernel_size=3, groups=4, padding=1),
}
SIZES = {1: (2, 4, 11), 2: (2, 4, 9, 10), 3: (1, 4, 5, 8, 7)}


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("options", sorted(OPTIONS))
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_convolution_matches_pytorch(dims, options, bias, export_and_compare):
    model = CONVOLUTIONS[dims](4, 8, bias=bias, **OPTIONS[options]).eval()
    program = export_and_compare(model, (torch.randn(SIZES[dims]),))
    convs = [node for node in all_nodes(program.model_proto) if node.op_type == "Conv"]
    assert len(convs) == 1 and len(convs[0].input) == (3 if bias else 2)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_unbatched_convolution_without_bias(dims, export_and_compare):
    model = CONVOLUTIONS[dims](4, 6, kernel_size=3, bias=False).eval()
    export_and_compare(model, (torch.randn(SIZES[dims][1:]),))


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_transposed_convolution_matches_pytorch(dims, bias, export_and_compare):
    model = TRANSPOSED[dims](4, 6, kernel_size=3, stride=2, padding=1, output_padding=1, groups=2, dilation=1, bias=bias).eval()
    export_and_compare(model, (torch.randn(SIZES[dims]),))


class Residual3d(nn.Module):
    """The block of 3-D video ResNets (r3d/mc3): bias-free Conv3d, BatchNorm3d, ReLU, a
    (2+1)-D separable pair as in r(2+1)d/S3D, and a strided shortcut."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv3d(3, 8, (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False), nn.BatchNorm3d(8), nn.ReLU())
        self.spatial = nn.Conv3d(8, 8, (1, 3, 3), padding=(0, 1, 1), bias=False)
        self.temporal = nn.Conv3d(8, 16, (3, 1, 1), stride=(2, 1, 1), padding=(1, 0, 0), bias=False)
        self.norm = nn.BatchNorm3d(16)
        self.shortcut = nn.Sequential(nn.Conv3d(8, 16, 1, stride=(2, 1, 1), bias=False), nn.BatchNorm3d(16))
        self.head = nn.Sequential(nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(16, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = self.norm(self.temporal(torch.relu(self.spatial(x))))
        return self.head(torch.relu(y + self.shortcut(x)))


def test_video_network_of_bias_free_3d_convolutions(export_and_compare):
    model = Residual3d().eval()
    with torch.no_grad():  # statistics that are not the identity
        for module in model.modules():
            if isinstance(module, nn.BatchNorm3d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
    export_and_compare(model, (torch.randn(2, 3, 6, 32, 32),))
