"""torchvision's detection and segmentation models end to end: a list of images in, a
list of dicts out (boxes, labels, scores...), equal to eager PyTorch.

Random weights give nearly equal scores everywhere, and the order of equal scores is
arbitrary: the models are initialized so that activations keep their scale (He init)
and the heads' scores differ (:func:`distinct_scores`), with the score threshold
lowered so that boxes come out."""

from __future__ import annotations

import pytest
import torch

torchvision = pytest.importorskip("torchvision", reason="torchvision cannot be imported in this environment (install fx2onnx[vision])", exc_type=ImportError)
from torchvision.models import detection, segmentation  # noqa: E402

import onnx_ir as ir  # noqa: E402

from conftest import assert_outputs_close, check_saved_model, export_program, make_options  # noqa: E402

pytestmark = pytest.mark.vision

_HEAD_LAYERS = ("cls_score", "cls_logits", "bbox_pred", "bbox_reg", "ctrness")


def distinct_scores(model: torch.nn.Module, image: torch.Tensor) -> torch.nn.Module:
    """He init everywhere, then the last layers of the heads scaled and shifted to outputs
    of mean 0 and standard deviation 2: scores spread over (0, 1), no two alike (a
    saturated sigmoid would tie many at 1.0, whose order is arbitrary)."""
    layers = {name: m for name, m in model.named_modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))}
    with torch.no_grad():
        for layer in layers.values():
            layer.weight.normal_(0, (2.0 / layer.weight[0].numel()) ** 0.5)
            if layer.bias is not None:
                layer.bias.zero_()
        spread: dict[str, tuple[float, float]] = {}

        def measure(name: str, output: torch.Tensor) -> None:  # a head called once per feature level: the widest
            if output.std().item() > spread.get(name, (0.0, 0.0))[1]:
                spread[name] = (output.mean().item(), output.std().item())

        hooks = [layer.register_forward_hook(lambda m, i, o, n=name: measure(n, o))
                 for name, layer in layers.items() if name.rsplit(".", 1)[-1] in _HEAD_LAYERS or any(h in name for h in _HEAD_LAYERS)]
        model([image])
        for hook in hooks:
            hook.remove()
        for name, (mean, std) in spread.items():
            layers[name].weight.mul_(2.0 / std)
            if layers[name].bias is not None:
                layers[name].bias.fill_(-mean * 2.0 / std)
    return model


def _unmatched_rows(actual: dict, expected: dict) -> list[int]:
    """Detections of `actual` with no equal detection (label, score, box) in `expected`."""
    used = torch.zeros(len(expected["scores"]), dtype=torch.bool)
    missing = []
    for row in range(len(actual["scores"])):
        equal = (
            (expected["labels"] == actual["labels"][row])
            & torch.isclose(expected["scores"], actual["scores"][row], rtol=1e-3, atol=1e-3)
            & torch.isclose(expected["boxes"], actual["boxes"][row], rtol=1e-3, atol=2e-2).all(dim=1)
            & ~used
        ).nonzero()
        if len(equal):
            used[equal[0, 0]] = True
        else:
            missing.append(row)
    return missing


def _compare(program, model: torch.nn.Module, image: torch.Tensor) -> None:
    """The best detections equal eager's; of all, at most 1 in 20 differs: float
    rounding moves a box across an NMS or top-k boundary where two scores nearly tie."""
    with torch.no_grad():
        (expected,) = model([image])
    (actual,) = program([image])
    assert sorted(actual) == sorted(expected)
    assert expected["boxes"].shape[0] > 0
    # the best scores in order; their detections among eager's (equal scores may swap places)
    torch.testing.assert_close(actual["scores"][:5], expected["scores"][:5], rtol=1e-3, atol=1e-3)
    assert not _unmatched_rows({key: value[:5] for key, value in actual.items()}, expected)
    assert abs(len(actual["scores"]) - len(expected["scores"])) <= len(expected["scores"]) // 20
    assert len(_unmatched_rows(actual, expected)) <= len(expected["scores"]) // 20


_SIZES = {"min_size": 128, "max_size": 160}


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda **w: detection.fasterrcnn_mobilenet_v3_large_320_fpn(**w, box_score_thresh=0.0, **_SIZES), id="fasterrcnn_mobilenet"),
        pytest.param(lambda **w: detection.retinanet_resnet50_fpn(**w, score_thresh=0.0, **_SIZES), id="retinanet"),
        pytest.param(lambda **w: detection.fcos_resnet50_fpn(**w, score_thresh=0.0, **_SIZES), id="fcos"),
        pytest.param(lambda **w: detection.ssdlite320_mobilenet_v3_large(**w, score_thresh=0.0), id="ssdlite"),  # resizes to 320
    ],
)
def test_detection_model_matches_eager_at_two_sizes(make, tmp_path) -> None:
    torch.manual_seed(0)
    for size in ((128, 160), (160, 128)):
        image = torch.rand(3, *size)
        model = distinct_scores(make(weights=None, weights_backbone=None).eval(), image)
        program = export_program(model, ([image],), tmp_path=tmp_path)
        check_saved_model(program, tmp_path / "m.onnx")
        _compare(program, model, image)


@pytest.mark.parametrize("name", ["fcn_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large"])
def test_segmentation_model_with_dynamic_batch_and_image_size(name, tmp_path) -> None:
    torch.manual_seed(0)
    model = getattr(segmentation, name)(weights=None, weights_backbone=None).eval()
    program = export_program(model, (torch.rand(1, 3, 96, 128),), options=make_options(tmp_path, dynamic_shapes=True), tmp_path=tmp_path)
    check_saved_model(program, tmp_path / "m.onnx")
    assert all(isinstance(d, ir.SymbolicDim) for d in program.model.graph.inputs[0].shape if d != 3)
    for image in (torch.rand(1, 3, 96, 128), torch.rand(2, 3, 128, 96)):
        with torch.no_grad():
            expected = model(image)
        assert_outputs_close(program(image), expected, rtol=1e-3, atol=1e-4)
