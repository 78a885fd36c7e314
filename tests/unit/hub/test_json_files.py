"""The folder's JSON files (fx2onnx/hub/shared/json_files.py): errors that name the file,
one written format, files written whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fx2onnx.hub.shared.folder_files import processor_file_settings
from fx2onnx.hub.shared.json_files import edit_json_file, read_json, read_json_if_present, write_json_file


def test_a_missing_or_broken_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"'.*config\.json' is missing"):
        read_json(tmp_path / "config.json")
    assert read_json_if_present(tmp_path / "config.json") is None and read_json_if_present(tmp_path / "config.json", {}) == {}
    (tmp_path / "config.json").write_text('{"a": 1,}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"'.*config\.json' is not JSON: .* at line 1, column 9"):
        read_json_if_present(tmp_path / "config.json")  # present but broken: an error, not the default
    (tmp_path / "config.json").write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ValueError, match=r"'.*config\.json' is not JSON: it is not UTF-8 text"):
        read_json(tmp_path / "config.json")


def test_written_indented_with_the_text_as_it_is_and_whole(tmp_path: Path) -> None:
    content = {"name": "café 東京", "sizes": [1, 2]}
    assert write_json_file(tmp_path / "new", "settings.json", content) == "settings.json"  # the folder made
    text = (tmp_path / "new" / "settings.json").read_text(encoding="utf-8")
    assert text == json.dumps(content, indent=2, ensure_ascii=False) + "\n" and "東京" in text
    with pytest.raises(TypeError):  # content that is not JSON: the file before is left as it was
        write_json_file(tmp_path / "new", "settings.json", {"bad": object()})
    assert read_json(tmp_path / "new" / "settings.json") == content
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["settings.json"]  # no temporary file left


def test_an_edit_writes_only_a_change(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer_config.json"
    path.write_text('{"b":1}', encoding="utf-8")  # as another tool wrote it
    assert edit_json_file(path, lambda content: False) is False and path.read_text(encoding="utf-8") == '{"b":1}'
    assert edit_json_file(path, lambda content: content.update(a="ü") is None) is True
    assert path.read_text(encoding="utf-8") == '{\n  "b": 1,\n  "a": "ü"\n}\n'


def test_a_processor_s_settings_from_either_file(tmp_path: Path) -> None:
    assert processor_file_settings(tmp_path, "image_processor") is None
    write_json_file(tmp_path, "processor_config.json", {"image_processor": {"size": 4}, "feature_extractor": {"n": 2}})
    assert processor_file_settings(tmp_path, "image_processor") == {"size": 4}
    assert processor_file_settings(tmp_path, "feature_extractor") == {"n": 2}
    write_json_file(tmp_path, "preprocessor_config.json", {"size": 8})  # the processor's own file comes first
    assert processor_file_settings(tmp_path, "image_processor") == {"size": 8}
