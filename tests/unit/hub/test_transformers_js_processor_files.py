"""The processor files of an image-text-to-text folder for Transformers.js
(fx2onnx/hub/vision_language/transformers_js.py) and the chat template its tokenizer reads
(fx2onnx/hub/shared/tokenizer_files.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from fx2onnx.hub.shared.tokenizer_files import template_in_tokenizer_config
from fx2onnx.hub.vision_language.transformers_js import write_processor_class

SETTINGS = {"image_processor_type": "Gemma3ImageProcessor", "size": {"height": 64, "width": 64}}


def _folders(tmp_path: Path, files: dict[str, str]) -> tuple[Path, Path]:
    source, staging = tmp_path / "source", tmp_path / "staging"
    source.mkdir()
    staging.mkdir()
    for name, content in files.items():
        (source / name).write_text(content, encoding="utf-8")
    return source, staging


def test_a_processor_saved_by_transformers_5_gets_a_preprocessor_config_naming_its_class(tmp_path):
    """transformers 5 saves Gemma 3's processor as processor_config.json alone (the image
    processor nested): preprocessor_config.json, which Transformers.js's AutoProcessor needs,
    is written from it naming Gemma3Processor; a type whose processor is not named gets none."""
    nested = {"image_processor": SETTINGS, "image_seq_length": 256, "processor_class": "Gemma3Processor"}
    source, staging = _folders(tmp_path, {"processor_config.json": json.dumps(nested)})
    assert write_processor_class(source, staging, SimpleNamespace(model_type="gemma3")) == ["preprocessor_config.json"]
    written = json.loads((staging / "preprocessor_config.json").read_text(encoding="utf-8"))
    assert written == {**SETTINGS, "processor_class": "Gemma3Processor"}
    assert write_processor_class(source, tmp_path, SimpleNamespace(model_type="llava")) == []


def test_the_chat_template_file_goes_into_tokenizer_config_where_it_has_none(tmp_path):
    """chat_template.jinja's template copied into tokenizer_config.json (Transformers.js's
    tokenizer reads it there alone); a template tokenizer_config.json has is kept."""
    folder, _ = _folders(tmp_path, {"chat_template.jinja": "{{ messages }}", "tokenizer_config.json": "{}"})
    assert template_in_tokenizer_config(folder)
    assert json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")) == {"chat_template": "{{ messages }}"}
    (folder / "chat_template.jinja").write_text("other", encoding="utf-8")
    assert not template_in_tokenizer_config(folder)
    assert json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))["chat_template"] == "{{ messages }}"
