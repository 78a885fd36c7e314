"""The processor files of an image-text-to-text folder for Transformers.js
(fx2onnx/hub/vision_language/transformers_js.py) and the chat template its tokenizer reads
(fx2onnx/hub/shared/tokenizer_files.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from fx2onnx.hub.shared.tokenizer_files import template_in_tokenizer_config
from fx2onnx.hub.vision_language.transformers_js import write_processor_class
from fx2onnx.hub.vision_language.transformers_js_processors import added_token_text, lighton_ocr_image_settings

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
    is written from it naming Gemma3Processor; a type whose processor is not named gets none, LLaVA
    LlavaProcessor under the "full" feature strategy alone."""
    nested = {"image_processor": SETTINGS, "image_seq_length": 256, "processor_class": "Gemma3Processor"}
    source, staging = _folders(tmp_path, {"processor_config.json": json.dumps(nested)})
    assert write_processor_class(source, staging, SimpleNamespace(model_type="gemma3")) == ["preprocessor_config.json"]
    written = json.loads((staging / "preprocessor_config.json").read_text(encoding="utf-8"))
    assert written == {**SETTINGS, "processor_class": "Gemma3Processor"}
    assert write_processor_class(source, tmp_path, SimpleNamespace(model_type="llava")) == []
    default, full = (SimpleNamespace(model_type="llava", vision_feature_select_strategy=kind) for kind in ("default", "full"))
    assert write_processor_class(source, tmp_path / "none", default) == []
    (tmp_path / "full").mkdir()
    assert write_processor_class(source, tmp_path / "full", full) == ["preprocessor_config.json"]
    assert _written(tmp_path / "full", "preprocessor_config.json")["processor_class"] == "LlavaProcessor"


def test_gemma3n_folder_names_its_processor_with_the_feature_extractor_beside_the_image_processor(tmp_path):
    """Gemma3nProcessor in Transformers.js builds its image processor and its feature extractor from
    preprocessor_config.json: the feature extractor's settings transformers 5 nests in
    processor_config.json are merged in, the token counts added from the config where the file
    lacks them; a source without a feature extractor gets no processor class (it would not load)."""
    audio = {"feature_extractor_type": "Gemma3nAudioFeatureExtractor", "hop_length": 160}
    image = {"image_processor_type": "SiglipImageProcessor", "size": {"height": 128, "width": 128}}
    config = SimpleNamespace(model_type="gemma3n", vision_soft_tokens_per_image=16, audio_soft_tokens_per_image=12)
    nested = {"image_processor": image, "feature_extractor": audio, "image_seq_length": 16}
    source, staging = _folders(tmp_path, {"processor_config.json": json.dumps(nested), "tokenizer.json": TOKENIZER})
    assert write_processor_class(source, staging, config) == ["preprocessor_config.json", "processor_config.json"]
    assert _written(staging, "preprocessor_config.json") == {**audio, **image, "processor_class": "Gemma3nProcessor"}
    assert _written(staging, "processor_config.json") == {**nested, "audio_seq_length": 12}
    (source / "processor_config.json").write_text(json.dumps({"image_processor": image}), encoding="utf-8")
    assert write_processor_class(source, tmp_path / "none", config) == []


def test_the_chat_template_file_goes_into_tokenizer_config_where_it_has_none(tmp_path):
    """chat_template.jinja's template copied into tokenizer_config.json (Transformers.js's
    tokenizer reads it there alone); a template tokenizer_config.json has is kept."""
    folder, _ = _folders(tmp_path, {"chat_template.jinja": "{{ messages }}", "tokenizer_config.json": "{}"})
    assert template_in_tokenizer_config(folder)
    assert json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")) == {"chat_template": "{{ messages }}"}
    (folder / "chat_template.jinja").write_text("other", encoding="utf-8")
    assert not template_in_tokenizer_config(folder)
    assert json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))["chat_template"] == "{{ messages }}"


# a tokenizer.json adding the image token as id 7
TOKENIZER = json.dumps({"added_tokens": [{"id": 3, "content": "<s>"}, {"id": 7, "content": "[IMG]"}]})
PIXTRAL_CONFIG = dict(vision_config=SimpleNamespace(patch_size=14), spatial_merge_size=2, image_token_id=7)


def _written(staging: Path, name: str) -> dict:
    return json.loads((staging / name).read_text(encoding="utf-8"))


def test_idefics3_gets_image_seq_len_where_its_source_has_no_processor_config(tmp_path):
    """Idefics3Processor in Transformers.js reads image_seq_len from processor_config.json: a
    source with its image processor saved alone gets one, the tokens of a crop after the pixel
    shuffle ((56 / 14)^2 / 2^2 = 4); SmolVLM's names SmolVLMProcessor."""
    settings = {"image_processor_type": "Idefics3ImageProcessor", "max_image_size": {"longest_edge": 56}}
    config = dict(vision_config=SimpleNamespace(image_size=56, patch_size=14), scale_factor=2)
    for model_type, processor_class in (("idefics3", "Idefics3Processor"), ("smolvlm", "SmolVLMProcessor")):
        (tmp_path / model_type).mkdir()
        source, staging = _folders(tmp_path / model_type, {"preprocessor_config.json": json.dumps(settings)})
        assert write_processor_class(source, staging, SimpleNamespace(model_type=model_type, **config)) == [
            "preprocessor_config.json", "processor_config.json"]
        assert _written(staging, "preprocessor_config.json") == {**settings, "processor_class": processor_class}
        assert _written(staging, "processor_config.json") == {"image_seq_len": 4}


def test_mistral3_processor_config_keeps_the_sources_entries_and_gets_those_it_lacks(tmp_path):
    """PixtralProcessor's entries added to the source's processor_config.json where it lacks
    them (the image token's text from tokenizer.json, transformers' break and end tokens, the
    config's patch sizes), the source's own kept; the image processor resizing to the merged
    patch as Transformers.js reads it (patch_size x spatial_merge_size, numbers)."""
    settings = {"image_processor_type": "PixtralImageProcessor", "patch_size": {"height": 14, "width": 14}}
    source, staging = _folders(tmp_path, {"preprocessor_config.json": json.dumps(settings), "tokenizer.json": TOKENIZER,
                                          "processor_config.json": json.dumps({"image_break_token": "[BREAK]"})})
    config = SimpleNamespace(model_type="mistral3", **PIXTRAL_CONFIG)
    assert write_processor_class(source, staging, config) == ["preprocessor_config.json", "processor_config.json"]
    assert _written(staging, "preprocessor_config.json") == {
        **settings, "patch_size": 28, "spatial_merge_size": 1, "processor_class": "PixtralProcessor"}
    assert _written(staging, "processor_config.json") == {
        "image_break_token": "[BREAK]", "image_token": "[IMG]", "image_end_token": "[IMG_END]", "patch_size": 14,
        "spatial_merge_size": 2}


def test_lighton_ocr_tokens_without_breaks_and_its_own_square_patch(tmp_path):
    """LightOnOCR's processor writes an image's tokens without breaks: empty break and end
    tokens for Transformers.js's PixtralProcessor; its image processor keeps its own patch (its
    processor gives none), a square one: another is refused, saying why."""
    settings = {"image_processor_type": "PixtralImageProcessor", "patch_size": {"height": 28, "width": 28}}
    source, staging = _folders(tmp_path, {"preprocessor_config.json": json.dumps(settings), "tokenizer.json": TOKENIZER})
    write_processor_class(source, staging, SimpleNamespace(model_type="lighton_ocr", **PIXTRAL_CONFIG))
    assert _written(staging, "preprocessor_config.json")["patch_size"] == 28
    assert _written(staging, "processor_config.json") == {
        "image_token": "[IMG]", "image_break_token": "", "image_end_token": "", "patch_size": 14, "spatial_merge_size": 2}
    with pytest.raises(ValueError, match="not square"):
        lighton_ocr_image_settings(None, {"patch_size": {"height": 28, "width": 14}})


def test_an_image_token_the_tokenizer_has_not_added_is_a_clear_error(tmp_path):
    source, _ = _folders(tmp_path, {"tokenizer.json": TOKENIZER})
    assert added_token_text(source)(7) == "[IMG]"
    with pytest.raises(ValueError, match="no tokenizer.json adding token 9"):
        added_token_text(source)(9)
