"""export-hf's note on RT-DETR-style detectors: Transformers.js's object-detection pipeline
post-processes them with DETR's rule, not transformers' sigmoid over query-label pairs."""

from __future__ import annotations

import pytest

from fx2onnx.hub.decoders.client_support import TRANSFORMERS_JS
from fx2onnx.hub.recipes.pipeline_task import RECIPE, detection_client_note


@pytest.mark.parametrize("model_type, architecture", [
    ("rt_detr", "RTDetrForObjectDetection"), ("rt_detr_v2", "RTDetrV2ForObjectDetection"),
    ("d_fine", "DFineForObjectDetection")])
def test_note_for_the_sigmoid_detectors(model_type, architecture):
    config = {"model_type": model_type, "architectures": [architecture]}
    note = detection_client_note(config)
    assert note.startswith(TRANSFORMERS_JS) and "DETR's rule" in note and "sigmoid" in note and model_type in note
    assert "logits and pred_boxes are exact" in note
    assert RECIPE.client_note(config, False) == note  # what export-hf says of the pipeline tasks' folders


def test_no_note_for_detr_rule_models_or_other_heads():
    """DETR and YOLOS score with the softmax in transformers as well; an RT-DETR backbone is no detector."""
    assert detection_client_note({"model_type": "detr", "architectures": ["DetrForObjectDetection"]}) is None
    assert detection_client_note({"model_type": "yolos", "architectures": ["YolosForObjectDetection"]}) is None
    assert detection_client_note({"model_type": "rt_detr", "architectures": ["RTDetrModel"]}) is None
    assert RECIPE.client_note({"model_type": "yolos", "architectures": ["YolosForObjectDetection"]}, False) is None
