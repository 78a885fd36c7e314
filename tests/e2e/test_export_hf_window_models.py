"""Shifted-window image models (Swin, Swin V2) in `export-hf`: the capture keeps the images'
height and width static at the example's size (fx2onnx/capture/libraries/transformers_windows.py),
says so, and the folder matches transformers at several batch sizes.

The images are 56 pixels: a 14 x 14 patch grid that the first stage pads to whole windows
of 4 and the patch merging to an even size, so every padding branch runs."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch

from fx2onnx.capture.library_adapters import static_window_image_sizes
from fx2onnx.hub import export_hf

transformers = pytest.importorskip("transformers")

_SIZES = dict(image_size=56, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4, num_labels=3)
MODELS = {
    "swin": lambda: transformers.SwinForImageClassification(transformers.SwinConfig(**_SIZES)),
    "swinv2": lambda: transformers.Swinv2ForImageClassification(transformers.Swinv2Config(**_SIZES)),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_window_model_folder_has_static_image_sizes_and_matches_transformers(name, tmp_path):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    model.save_pretrained(tmp_path / "source")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = export_hf(tmp_path / "source", tmp_path / "out", verify=True)
    assert result.verification.passed, result.verification.summary()  # batches 2 and 3
    said = [str(w.message) for w in caught if "keeps its height and width static (56 x 56" in str(w.message)]
    assert said and "Layer.maybe_pad" in said[0]
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
    changed, notes = static_window_image_sizes(spec, swin, {"pixel_values": images})
    assert list(changed["pixel_values"]) == [0, 1] and len(notes) == 1
    assert list(spec["pixel_values"]) == [0, 1, 2, 3]  # the caller's spec is not edited
    vit = transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=56, patch_size=8))
    assert static_window_image_sizes(spec, vit, {"pixel_values": images}) == (spec, [])
