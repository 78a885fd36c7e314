"""Library adapters at capture: torchvision's functions that branch on data-dependent
sizes are replaced during a capture only, and each replacement computes what the
original computes, on empty and non-empty inputs."""

from __future__ import annotations

import importlib

import pytest
import torch

from fx2onnx.capture.library_adapters import CAPTURE_REWRITES, library_adapters_at_capture, rewrite_site, rewritten_library_functions

torchvision = pytest.importorskip("torchvision", reason="torchvision cannot be imported in this environment (install fx2onnx[vision])", exc_type=ImportError)
from torchvision.ops import boxes as box_ops, poolers  # noqa: E402

pytestmark = pytest.mark.vision


def _boxes(count: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    corner = torch.rand(count, 2, generator=generator) * 60
    size = torch.rand(count, 2, generator=generator) * 30 + 1
    return torch.cat([corner, corner + size], dim=1)


def _resolve(module: str, attribute: str):
    """``module.attribute``, the attribute maybe a class's method (``Class.method``)."""
    owner, name = rewrite_site(importlib.import_module(module), attribute)
    return getattr(owner, name)


def _rewrite(module: str, attribute: str):
    (rewrite,) = [r for r in CAPTURE_REWRITES if (r.module, r.attribute) == (module, attribute)]
    return rewrite.replacement(_resolve(module, attribute))


@pytest.mark.parametrize("count", [0, 1, 40, 1200], ids=["empty", "one", "offset_trick", "per_class"])
def test_batched_nms_rewrite_keeps_the_boxes_torchvision_keeps(count: int) -> None:
    boxes, scores = _boxes(count), torch.rand(count)
    classes = torch.randint(0, 4, (count,))
    rewritten = _rewrite("torchvision.ops.boxes", "batched_nms")
    want = box_ops.batched_nms(boxes, scores, classes, 0.3)
    got = rewritten(boxes, scores, classes, 0.3)
    assert got.dtype == torch.int64
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("counts", [(0, 0), (3, 0), (5, 7)], ids=["no_boxes", "one_image_empty", "two_images"])
def test_multiscale_roi_align_rewrite_equals_the_original(counts: tuple[int, ...]) -> None:
    pooler = poolers.MultiScaleRoIAlign(["0", "1"], output_size=3, sampling_ratio=2)
    features = {"0": torch.randn(2, 4, 32, 32), "1": torch.randn(2, 4, 16, 16)}
    boxes = [_boxes(n, seed=i) * 2 for i, n in enumerate(counts)]
    boxes[-1][:2] *= 0.2  # small boxes: the lower feature level
    sizes = [(128, 128)] * len(counts)
    want = pooler(features, boxes, sizes)
    with rewritten_library_functions():
        got = pooler(features, boxes, sizes)
    assert got.shape == want.shape == (sum(counts), 4, 3, 3)
    torch.testing.assert_close(got, want)


def test_rewrites_are_undone_after_the_capture_even_on_error() -> None:
    originals = {(module, r.attribute): _resolve(module, r.attribute)
                 for r in CAPTURE_REWRITES for module in r.modules if not r.shadows_builtin}
    # a builtin shadowed by a module global during the capture only (`len`): no such global after
    shadowed = [(module, r.attribute) for r in CAPTURE_REWRITES for module in r.modules if r.shadows_builtin]
    with pytest.raises(RuntimeError, match="inside"):
        with library_adapters_at_capture():
            assert box_ops.batched_nms is not originals[("torchvision.ops.boxes", "batched_nms")]
            raise RuntimeError("inside")
    for (module, attribute), original in originals.items():
        assert _resolve(module, attribute) is original
    assert not [(module, name) for module, name in shadowed if name in vars(importlib.import_module(module))]


def test_batched_nms_of_a_data_dependent_number_of_boxes_exports(export_and_compare) -> None:
    def keep_confident(boxes: torch.Tensor, scores: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        confident = torch.where(scores > 0.5)[0]  # how many: known only at run time
        return box_ops.batched_nms(boxes[confident], scores[confident], classes[confident], 0.3)

    boxes, scores, classes = _boxes(30), torch.rand(30), torch.randint(0, 3, (30,))
    program = export_and_compare(keep_confident, (boxes, scores, classes),
                                 second_inputs=((boxes, torch.zeros(30), classes), {}))  # nothing confident: empty
    (output,) = program.model.graph.outputs
    assert isinstance(output.shape[0].value, str)  # a named dynamic dim, not a fixed count


@pytest.mark.parametrize("count", [0, 1, 9], ids=["empty", "one", "several"])
def test_paste_masks_rewrite_equals_the_original(count: int) -> None:
    from torchvision.models.detection import roi_heads

    generator = torch.Generator().manual_seed(count)
    masks = torch.rand(count, 1, 28, 28, generator=generator)
    boxes = _boxes(count, seed=count) * 1.5 - 5  # some cross the image's edges (none lies wholly outside, as after clipping)
    if count > 1:
        boxes[1] = torch.tensor([20.0, 30.0, 20.2, 30.1])  # thinner than a pixel
    rewritten = _rewrite("torchvision.models.detection.roi_heads", "paste_masks_in_image")
    want = roi_heads.paste_masks_in_image(masks, boxes, (100, 120))
    got = rewritten(masks, boxes, (100, 120))
    assert got.shape == want.shape == (count, 1, 100, 120)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("count", [0, 1, 6], ids=["empty", "one", "several"])
def test_heatmaps_to_keypoints_rewrite_equals_the_original(count: int) -> None:
    from torchvision.models.detection import roi_heads

    generator = torch.Generator().manual_seed(count)
    maps = torch.randn(count, 17, 56, 56, generator=generator)
    rois = _boxes(count, seed=count)
    if count > 1:
        rois[1, 2:] = rois[1, :2] + 0.4  # narrower than a pixel: a 1 x 1 map
    rewritten = _rewrite("torchvision.models.detection.roi_heads", "heatmaps_to_keypoints")
    want, got = roi_heads.heatmaps_to_keypoints(maps, rois), rewritten(maps, rois)
    assert got[0].shape == want[0].shape == (count, 17, 3)
    torch.testing.assert_close(got, want)


class _DetectionTransform(torch.nn.Module):
    """torchvision's detection transform (normalize, resize, batch), its batch out."""

    def __init__(self, size_divisible: int) -> None:
        super().__init__()
        from torchvision.models.detection.transform import GeneralizedRCNNTransform

        self.transform = GeneralizedRCNNTransform(128, 160, [0.4, 0.5, 0.6], [0.2, 0.3, 0.25], size_divisible=size_divisible)

    def forward(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        return self.transform([first, second])[0].tensors


@pytest.mark.parametrize("size_divisible", [32, 1])
def test_detection_resize_and_batching_stay_symbolic_in_the_image_size(export_and_compare, size_divisible: int) -> None:
    """Exported with dynamic image sizes, the transform resizes and pads as in eager at
    other sizes and the other orientation: the rewrites keep the scale and the padded
    size symbolic, where torchvision's Python `min` and `int(math.ceil(...))` fix them."""
    from fx2onnx import ExportOptions

    model = _DetectionTransform(size_divisible).eval()
    example = (torch.rand(3, 128, 160), torch.rand(3, 100, 150))
    other = (torch.rand(3, 150, 96), torch.rand(3, 77, 200))  # other orientation, other scale
    program = export_and_compare(model, example, options=ExportOptions(dynamic_shapes=True), second_inputs=(other, {}))
    assert program(*other).shape == model(*other).shape != model(*example).shape
    assert not [d for d in program.model.graph.inputs[0].shape if isinstance(d, int) and d != 3]

