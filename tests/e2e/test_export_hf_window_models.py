"""Shifted-window image models (Swin, Swin V2): asked for every dim dynamic, the capture
keeps the images' height and width static at the example's size
(fx2onnx/capture/libraries/transformers_image_sizes.py) and says so; the `export-hf` folder and
the `dynamo_export` model match transformers at several batch sizes.

The images are 56 pixels: a 14 x 14 patch grid that the first stage pads to whole windows
of 4 and the patch merging to an even size, so every padding branch runs."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch

from fx2onnx.capture.library_adapters import static_image_sizes_at_capture
from fx2onnx.hub import export_hf

transformers = pytest.importorskip("transformers")

_SIZES = dict(image_size=56, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4, num_labels=3)
MODELS = {
    "swin": lambda: transformers.SwinForImageClassification(transformers.SwinConfig(**_SIZES)),
    "swinv2": lambda: transformers.Swinv2ForImageClassification(transformers.Swinv2Config(**_SIZES)),
}


def test_window_model_folder_has_static_image_sizes_and_matches_transformers(tmp_path):
    torch.manual_seed(0)
    model = MODELS["swin"]().eval()
    model.save_pretrained(tmp_path / "source")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = export_hf(tmp_path / "source", tmp_path / "out", verify=True)
    assert result.verification.passed, result.verification.summary()  # batches 2 and 3
    said = [str(w.message) for w in caught if "keeps its height and width static (56 x 56" in str(w.message)]
    assert said and "SwinLayer.maybe_pad" in said[0]
    path = tmp_path / "out" / "onnx" / "model.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    pixels = onnx.load(str(path), load_external_data=False).graph.input[0]
    assert [d.dim_param or d.dim_value for d in pixels.type.tensor_type.shape.dim] == ["batch_size", 3, 56, 56]

    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (1, 5):
        images = torch.randn(batch, 3, 56, 56, generator=torch.Generator().manual_seed(batch))
        (logits,) = session.run(["logits"], {"pixel_values": images.numpy()})
        with torch.no_grad():
            expected = model(pixel_values=images).logits.numpy()
        np.testing.assert_allclose(logits, expected, rtol=1e-3, atol=1e-4)
        assert np.abs(expected).max() > 1e-3


def test_only_window_models_keep_their_image_sizes_static():
    images = torch.randn(2, 3, 56, 56)
    spec = {"pixel_values": {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO, 3: torch.export.Dim.AUTO}}
    swin = MODELS["swin"]()
    changed, notes = static_image_sizes_at_capture(spec, swin, {"pixel_values": images})
    assert list(changed["pixel_values"]) == [0, 1] and len(notes) == 1
    assert list(spec["pixel_values"]) == [0, 1, 2, 3]  # the caller's spec is not edited
    vit = transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=56, patch_size=8))
    assert static_image_sizes_at_capture(spec, vit, {"pixel_values": images}) == (spec, [])


def test_dynamo_export_of_a_window_model_records_its_static_image_sizes():
    import fx2onnx
    from diagnostics import Level

    torch.manual_seed(0)
    model = MODELS["swinv2"]().eval()
    images = torch.randn(2, 3, 56, 56)
    with pytest.warns(UserWarning, match="keeps its height and width static"):
        program = fx2onnx.dynamo_export(model, pixel_values=images, export_options=fx2onnx.ExportOptions(dynamic_shapes=True))
    notes = [d for d in program.diagnostics if d.level == Level.NOTE and "keeps its height and width static" in d.message]
    assert len(notes) == 1 and notes[0].rule.id == "FXE0017" and "Swinv2Layer.maybe_pad" in notes[0].message
    onnx.checker.check_model(program.model_proto, full_check=True)
    dims = [d.dim_param or d.dim_value for d in program.model_proto.graph.input[0].type.tensor_type.shape.dim]
    assert isinstance(dims[0], str) and dims[1:] == [3, 56, 56]  # the batch stays dynamic
    more = torch.randn(4, 3, 56, 56)
    with torch.no_grad():
        expected = model(pixel_values=more).logits
    torch.testing.assert_close(program(pixel_values=more).logits, expected, rtol=1e-3, atol=1e-4)


def test_a_multi_scale_patch_encoder_keeps_its_image_sizes_static():
    """DepthPro cuts its image into patches at several scales, their count and its maps' sizes
    computed in Python from the image's: its height and width static, the batch dynamic."""
    images = torch.randn(2, 3, 128, 128)
    spec = {"pixel_values": {dim: torch.export.Dim.AUTO for dim in range(4)}}
    encoder = dict(model_type="dinov2", hidden_size=16, num_hidden_layers=1, num_attention_heads=2, patch_size=8)
    model = transformers.DepthProForDepthEstimation(transformers.DepthProConfig(
        patch_size=32, intermediate_hook_ids=[0, 0], intermediate_feature_dims=[8, 8], scaled_images_feature_dims=[16, 16, 8],
        fusion_hidden_size=16, image_model_config=encoder, patch_model_config=encoder, fov_model_config=encoder))
    changed, notes = static_image_sizes_at_capture(spec, model, {"pixel_values": images})
    assert list(changed["pixel_values"]) == [0, 1] and len(notes) == 1
    assert "(128 x 128, the example's)" in notes[0] and "patches at several scales (DepthProEncoder)" in notes[0]
