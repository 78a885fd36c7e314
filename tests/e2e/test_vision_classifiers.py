"""torchvision's classifiers exported from one image with dynamic_shapes=True run at any
batch: equal to eager PyTorch at a batch of 3 (the batch is not fixed to the example's 1,
whatever torch's own kernels compare it with)."""

from __future__ import annotations

import pytest
import torch

torchvision = pytest.importorskip("torchvision", reason="torchvision cannot be imported in this environment (install fx2onnx[vision])", exc_type=ImportError)

from conftest import ATOL, RTOL, export_and_compare_impl, make_options  # noqa: E402

pytestmark = pytest.mark.vision

CLASSIFIERS = ["convnext_tiny", "resnet18", "mobilenet_v3_small", "efficientnet_b0", "regnet_y_400mf", "vit_b_16", "swin_t"]


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_classifier_exported_from_one_image_runs_at_batch_3(name, tmp_path):
    model = getattr(torchvision.models, name)(weights=None).eval()
    if name == "vit_b_16":  # its head starts at zero: every logit would be 0
        torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    options = make_options(tmp_path, dynamic_shapes=True)
    program = export_and_compare_impl(model, (torch.randn(1, 3, 224, 224),), options=options, tmp_path=tmp_path,
                                      second_inputs=((torch.randn(3, 3, 224, 224),), {}), rtol=RTOL, atol=ATOL)
    assert str(program.model.graph.inputs[0].shape[0]) == "x_dim_0"
    assert not [w for w in program.warnings if "static in the ONNX model" in (w.message or "")]
    branches = [w.message for w in program.warnings if "branches on the dynamic input sizes" in (w.message or "")]
    if name != "swin_t":
        assert branches == []
        return
    # Swin shifts a stage's windows only when its padded feature map is larger than one
    # window: at 224 x 224 the last stage is one window, the others more; the export says
    # so for the height and the width, and it is due: at 256 x 320 the ONNX model differs
    assert len(branches) == 2 and all("swin_transformer.py:" in text for text in branches)
    assert any("x.shape[2]" in text for text in branches) and any("x.shape[3]" in text for text in branches)
    for size, equal in (((160, 200), True), ((256, 320), False)):
        image = torch.randn(1, 3, *size)
        with torch.no_grad():
            expected = model(image)
        assert torch.allclose(program(image), expected, rtol=RTOL, atol=ATOL) == equal, size


@pytest.mark.parametrize("name", ["convnext_tiny", "swin_t"])
def test_classifier_with_a_named_batch_from_one_image_runs_at_batch_3(name, tmp_path):
    model = getattr(torchvision.models, name)(weights=None).eval()
    options = make_options(tmp_path, dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    program = export_and_compare_impl(model, (torch.randn(1, 3, 224, 224),), options=options, tmp_path=tmp_path,
                                      second_inputs=((torch.randn(3, 3, 224, 224),), {}), rtol=RTOL, atol=ATOL)
    assert [str(d) for d in program.model.graph.inputs[0].shape] == ["batch", "3", "224", "224"]
