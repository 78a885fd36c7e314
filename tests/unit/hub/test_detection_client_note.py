"""export-hf's note on detectors built on RT-DETR's decoder: Transformers.js's object-detection
pipeline post-processes them with DETR's rule, not transformers' sigmoid over query-label
pairs. The rule follows the decoder's settings in config.json (RT_DETR_DECODER_SETTINGS), so
every model type on that code gets the note: checked on the configs transformers itself
saves for each object-detection class it has."""

from __future__ import annotations

import json

import pytest

from fx2onnx.hub.decoders.client_support import TRANSFORMERS_JS
from fx2onnx.hub.recipes.pipeline_task import RECIPE, TRANSFORMERS_JS_DETECTORS, detection_client_note

transformers = pytest.importorskip("transformers")

# the model types of transformers' object-detection classes on RT-DETR's decoder (their modular
# files import transformers.models.rt_detr's modules); which of them Transformers.js loads
RT_DETR_DECODER = {"rt_detr": True, "rt_detr_v2": True, "d_fine": True, "deimv2": False, "pp_doclayout_v2": False,
                   "pp_doclayout_v3": False, "pp_doclayout_v4": False}


def saved_config(model_type: str, tmp_path) -> dict:
    """config.json as transformers saves it for the model type's default config and its detection class."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES

    config = CONFIG_MAPPING[model_type]()
    config.architectures = [MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES[model_type]]
    config.save_pretrained(tmp_path / model_type)
    return json.loads((tmp_path / model_type / "config.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("model_type", sorted(RT_DETR_DECODER))
def test_note_for_every_detector_on_rt_detr_decoder(model_type, tmp_path):
    config = saved_config(model_type, tmp_path)
    note = detection_client_note(config)
    assert note is not None and note.startswith(TRANSFORMERS_JS) and model_type in note
    assert "DETR's rule" in note and "sigmoid" in note and "logits and pred_boxes are the model's outputs" in note
    # a model type Transformers.js has no class for: the note says it loads none
    assert ("Unsupported model type" in note) == (not RT_DETR_DECODER[model_type])
    assert (model_type in TRANSFORMERS_JS_DETECTORS) == RT_DETR_DECODER[model_type]
    assert RECIPE.client_note(config, False) == note  # what export-hf says of the pipeline tasks' folders


def test_no_note_for_the_other_detectors(tmp_path):
    """Every other object-detection class of transformers (DETR, YOLOS, Deformable DETR...) gets none."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES

    others = sorted(set(MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES) - set(RT_DETR_DECODER))
    assert {"detr", "yolos", "deformable_detr", "rf_detr"} <= set(others)
    for model_type in others:
        assert detection_client_note(saved_config(model_type, tmp_path)) is None, model_type


def test_no_note_for_a_backbone_or_base_model():
    """RT-DETR's decoder settings under a class that is no detector (the base model) give none."""
    config = {"model_type": "rt_detr", "architectures": ["RTDetrModel"], "num_denoising": 100, "anchor_image_size": None}
    assert detection_client_note(config) is None
    assert RECIPE.client_note({"model_type": "yolos", "architectures": ["YolosForObjectDetection"]}, False) is None
