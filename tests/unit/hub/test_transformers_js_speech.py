"""The processor files and client note of a speech encoder-decoder folder for Transformers.js
(fx2onnx/hub/speech/transformers_js_speech.py)."""

from __future__ import annotations

import json
from pathlib import Path

from fx2onnx.hub.speech.transformers_js_speech import client_note, ctc_client_note, write_processor_files

SETTINGS = {"feature_extractor_type": "CohereAsrFeatureExtractor", "feature_size": 128, "sampling_rate": 16000}


def _folders(tmp_path: Path, files: dict[str, dict]) -> tuple[Path, Path]:
    source, staging = tmp_path / "source", tmp_path / "staging"
    source.mkdir()
    staging.mkdir()
    for name, content in files.items():
        (source / name).write_text(json.dumps(content), encoding="utf-8")
    return source, staging


def _read(folder: Path, name: str) -> dict:
    return json.loads((folder / name).read_text(encoding="utf-8"))


def test_cohere_asr_gets_its_processor_named_and_a_processor_config(tmp_path):
    """A feature extractor saved alone: preprocessor_config.json names CohereAsrProcessor, and
    processor_config.json, which that class reads, is written."""
    source, staging = _folders(tmp_path, {"preprocessor_config.json": SETTINGS})
    assert write_processor_files(source, staging, "cohere_asr") == ["preprocessor_config.json", "processor_config.json"]
    assert _read(staging, "preprocessor_config.json") == {**SETTINGS, "processor_class": "CohereAsrProcessor"}
    assert _read(staging, "processor_config.json") == {"processor_class": "CohereAsrProcessor"}


def test_a_processor_saved_by_transformers_5_gets_a_preprocessor_config(tmp_path):
    """transformers 5 saves processor_config.json alone (settings nested): Transformers.js's
    AutoProcessor reads preprocessor_config.json, written from it; the source's own is kept."""
    nested = {"feature_extractor": {**SETTINGS, "feature_extractor_type": "Wav2Vec2FeatureExtractor"},
              "processor_class": "Wav2Vec2Processor"}
    source, staging = _folders(tmp_path, {"processor_config.json": nested})
    assert write_processor_files(source, staging, "moonshine") == ["preprocessor_config.json"]
    assert _read(staging, "preprocessor_config.json") == nested["feature_extractor"]
    assert write_processor_files(source, staging, "speech_to_text") == []  # no Transformers.js class to read it


def test_notes_name_what_transformers_js_cannot_do():
    encoder = {"num_attention_heads": 8}
    assert "runs this folder" in client_note({"model_type": "cohere_asr", "num_key_value_heads": 8, "encoder_config": encoder})
    unequal = client_note({"model_type": "cohere_asr", "num_key_value_heads": 4, "encoder_config": encoder})
    assert "cross-attention cache of 8 heads" in unequal and "cannot run this folder" in unequal
    assert "Missing the following inputs: input_values" in client_note({"model_type": "speecht5"})
    assert "no speech sequence-to-sequence class for seamless_m4t" in client_note({"model_type": "seamless_m4t"})
    assert client_note({"model_type": "t5"}) is None and client_note({"model_type": "whisper"}) is None


def test_ctc_note_for_a_model_the_pipeline_refuses():
    """WavLM's CTC head: Transformers.js loads it, its speech recognition pipeline throws; nothing
    said of the model types its pipeline transcribes, or of WavLM's classifier."""
    note = ctc_client_note({"model_type": "wavlm", "architectures": ["WavLMForCTC"]})
    assert "does not support model type 'wavlm'" in note and "AutoModelForCTC" in note
    assert ctc_client_note({"model_type": "hubert", "architectures": ["HubertForCTC"]}) is None
    assert ctc_client_note({"model_type": "wavlm", "architectures": ["WavLMForSequenceClassification"]}) is None
    from fx2onnx.hub.recipes.pipeline_task import RECIPE  # export-hf says it for the pipeline tasks' folders

    assert RECIPE.client_note({"model_type": "wavlm", "architectures": ["WavLMForCTC"]}, False) == note
