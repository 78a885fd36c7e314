"""The one table of transformers models whose images keep the example's height and width
(fx2onnx/capture/libraries/transformers_image_sizes.py): every entry says why, which step
keeps the sizes and what a capture at dynamic sizes gave; the capture's note is made of an
entry's reason (export-hf's folder note: tests/unit/hub/test_image_sizes.py); the docs
name every entry. Stand-in modules (named as transformers' are), no transformers model built."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from fx2onnx.capture.library_adapters import (
    STATIC_IMAGE_SIZES, KeptBy, static_image_size_reason, static_image_sizes_at_capture,
)

DOCS = Path(__file__).resolve().parents[3] / "docs" / "guides"
_TRANSFORMERS = "transformers.models.stand_in.modeling_stand_in"


def _stand_in(class_name: str, **attributes) -> torch.nn.Module:
    """An empty module of class ``class_name`` defined, as far as its module name goes, in transformers."""
    cls = type(class_name, (torch.nn.Module,), {"__module__": _TRANSFORMERS})
    module = cls()
    for name, value in attributes.items():
        setattr(module, name, value)
    return module


def _window_model() -> torch.nn.Module:
    model = _stand_in("SwinForImageClassification")
    model.layer = _stand_in("SwinLayer", window_size=4, maybe_pad=lambda *a: a)
    return model


def _model_of_type(class_name: str, model_type: str) -> torch.nn.Module:
    return _stand_in(class_name, config=SimpleNamespace(model_type=model_type, image_size=64))


def test_every_entry_says_why_at_which_step_and_what_a_dynamic_capture_gave() -> None:
    assert len(STATIC_IMAGE_SIZES) >= 6
    for entry in STATIC_IMAGE_SIZES:
        assert isinstance(entry.kept_by, KeptBy)
        assert entry.models and len(entry.reason) > 40 and len(entry.dynamic_capture) > 20, entry.models
        assert entry.why("Layer") == entry.reason.replace("{found}", "Layer")
        assert entry.found_in(torch.nn.Linear(2, 2)) is None  # no transformers module, no model type
    kept = {entry.kept_by for entry in STATIC_IMAGE_SIZES}
    assert kept == {KeptBy.CAPTURE, KeptBy.FOLDER}


def test_each_model_is_matched_at_its_own_step_only() -> None:
    swin = _window_model()
    assert "SwinLayer.maybe_pad" in static_image_size_reason(swin, KeptBy.CAPTURE)
    assert static_image_size_reason(swin, KeptBy.FOLDER) is None
    mobilevit = _model_of_type("MobileViTForImageClassification", "mobilevit")
    assert "math.ceil" in static_image_size_reason(mobilevit, KeptBy.FOLDER)
    assert static_image_size_reason(mobilevit, KeptBy.CAPTURE) is None
    perceiver = _model_of_type("PerceiverForImageClassificationConvProcessing", "perceiver")
    assert "position embeddings" in static_image_size_reason(perceiver, KeptBy.FOLDER)
    fourier = _model_of_type("PerceiverForImageClassificationFourier", "perceiver")  # no grid of the example's
    assert static_image_size_reason(fourier, KeptBy.FOLDER) is None


def test_the_capture_note_is_the_entrys_reason() -> None:
    swin = _window_model()
    images = torch.zeros(2, 3, 56, 40)
    spec = {"pixel_values": {dim: torch.export.Dim.AUTO for dim in range(4)}, "labels": {0: torch.export.Dim.AUTO}}
    changed, notes = static_image_sizes_at_capture(spec, swin, {"pixel_values": images, "labels": torch.zeros(2)})
    assert list(changed["pixel_values"]) == [0, 1] and list(changed["labels"]) == [0] and len(notes) == 1
    (entry,) = [e for e in STATIC_IMAGE_SIZES if e.found_in(swin)]
    assert notes[0].startswith("Input 'pixel_values' keeps its height and width static (56 x 40, the example's): "
                               f"SwinForImageClassification {entry.why('SwinLayer')}.")
    assert static_image_sizes_at_capture(spec, _stand_in("ViTModel"), {"pixel_values": images}) == (spec, [])


def test_the_docs_name_every_entry() -> None:
    docs = {KeptBy.CAPTURE: (DOCS / "dynamic-shapes.md").read_text(encoding="utf-8"),
            KeptBy.FOLDER: (DOCS / "export-hf" / "pipeline-tasks.md").read_text(encoding="utf-8")}
    text = {kept_by: " ".join(page.split()) for kept_by, page in docs.items()}
    for entry in STATIC_IMAGE_SIZES:
        for name in entry.models.split(", "):
            assert name in text[entry.kept_by], (name, entry.kept_by)
