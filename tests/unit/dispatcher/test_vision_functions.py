"""torchvision's operators as ONNX's (NonMaxSuppression, RoiAlign, MaxRoiPool, and
position-sensitive RoI Align from RoiAlign) match torchvision on empty and non-empty
inputs."""

from __future__ import annotations

import pytest
import torch

torchvision = pytest.importorskip("torchvision", reason="torchvision cannot be imported in this environment (install fx2onnx[vision])", exc_type=ImportError)
from torchvision import ops  # noqa: E402

import fx2onnx  # noqa: E402
from conftest import make_options, op_types  # noqa: E402

pytestmark = pytest.mark.vision


def _boxes(count: int, seed: int = 0, extent: float = 60.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    corner = torch.rand(count, 2, generator=generator) * extent
    size = torch.rand(count, 2, generator=generator) * extent / 2 + 1
    return torch.cat([corner, corner + size], dim=1)


def _rois(count: int, batch: int = 2) -> torch.Tensor:
    """torchvision's (K, 5) RoIs: batch index, then the box (some reaching past the map)."""
    return torch.cat([torch.arange(count).remainder(batch).float()[:, None], _boxes(count, extent=70.0)], dim=1)


def _confident_rois(rois: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    return rois[torch.where(scores > 0.5)[0]]  # how many: known only at run time


def test_nms_keeps_torchvisions_boxes_and_names_the_kept_count(export_and_compare) -> None:
    def keep(boxes: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return ops.nms(boxes, scores, 0.4)

    boxes, scores = _boxes(40), torch.rand(40)
    program = export_and_compare(keep, (boxes, scores), options=make_options(None, dynamic_shapes=True),
                                 second_inputs=((_boxes(0), torch.rand(0)), {}))
    assert "NonMaxSuppression" in op_types(program.model_proto)
    (kept,) = program.model.graph.outputs
    assert isinstance(kept.shape[0].value, str)


@pytest.mark.parametrize("aligned", [False, True], ids=["output_half_pixel", "half_pixel"])
@pytest.mark.parametrize("sampling_ratio", [-1, 0, 2], ids=["adaptive", "adaptive_zero", "two"])
def test_roi_align_matches_torchvision(aligned: bool, sampling_ratio: int, export_and_compare) -> None:
    def pool(features: torch.Tensor, rois: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return ops.roi_align(features, _confident_rois(rois, scores), (3, 4), 0.5, sampling_ratio, aligned)

    features, rois = torch.randn(2, 4, 24, 28), _rois(12)
    export_and_compare(pool, (features, rois, torch.rand(12)), second_inputs=((features, rois, torch.zeros(12)), {}))


def test_roi_pool_is_max_roi_pool(export_and_compare) -> None:
    def pool(features: torch.Tensor, rois: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return ops.roi_pool(features, _confident_rois(rois, scores), (3, 3), 0.25)

    features, rois = torch.randn(2, 4, 20, 20), _rois(10)
    program = export_and_compare(pool, (features, rois, torch.rand(10)), second_inputs=((features, rois, torch.zeros(10)), {}))
    assert "MaxRoiPool" in op_types(program.model_proto)


def test_reading_roi_pools_argmax_is_refused(tmp_path) -> None:
    def pool_with_positions(features: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        pooled, positions = torch.ops.torchvision.roi_pool(features, rois, 1.0, 2, 2)
        return pooled + positions

    with pytest.raises(fx2onnx.OnnxExporterError, match="reads output 1 of torchvision::roi_pool"):
        fx2onnx.dynamo_export(pool_with_positions, torch.randn(1, 2, 8, 8), _rois(3, batch=1),
                              export_options=make_options(tmp_path))


@pytest.mark.parametrize("sampling_ratio", [-1, 2], ids=["adaptive", "two"])
def test_ps_roi_align_matches_torchvision(sampling_ratio: int, export_and_compare) -> None:
    def pool(features: torch.Tensor, rois: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return ops.ps_roi_align(features, _confident_rois(rois, scores), (2, 3), 0.5, sampling_ratio)

    features, rois = torch.randn(2, 12, 24, 24), _rois(9)  # 2 output channels of 2 x 3 bins
    export_and_compare(pool, (features, rois, torch.rand(9)), second_inputs=((features, rois, torch.zeros(9)), {}))
