"""torchvision's 3-D video networks, whose convolutions have no bias (r3d_18, mc3_18 and
s3d): exported, run in onnxruntime and equal to eager PyTorch."""

from __future__ import annotations

import pytest
import torch

torchvision = pytest.importorskip("torchvision", reason="torchvision cannot be imported in this environment (install fx2onnx[vision])", exc_type=ImportError)
from torchvision.models import video  # noqa: E402

from conftest import ATOL, RTOL  # noqa: E402

pytestmark = pytest.mark.vision


def _with_statistics(model: torch.nn.Module) -> torch.nn.Module:
    """Random batch-norm statistics and He-initialized convolutions: activations keep
    their scale through 18 layers, so the comparison sees real numbers."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Conv3d):
                module.weight.normal_(0, (2.0 / module.weight[0].numel()) ** 0.5)
            if isinstance(module, torch.nn.BatchNorm3d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
    return model.eval()


@pytest.mark.parametrize(
    "name, shape",
    # s3d ends in a fixed (2, 7, 7) average pool: 16 frames of 224 x 224 at least
    [("r3d_18", (1, 3, 4, 32, 32)), ("mc3_18", (2, 3, 4, 32, 32)), ("s3d", (1, 3, 16, 224, 224))],
)
def test_video_network_matches_eager(name, shape, export_and_compare):
    model = _with_statistics(getattr(video, name)(weights=None, num_classes=10))
    program = export_and_compare(model, (torch.randn(shape),), rtol=RTOL, atol=ATOL)
    with torch.no_grad():
        assert model(torch.randn(shape)).std() > 1e-3  # outputs that differ: a real comparison
    assert program.model_proto.graph.output[0].type.tensor_type.shape.dim[1].dim_value == 10
