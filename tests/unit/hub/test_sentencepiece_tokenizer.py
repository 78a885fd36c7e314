"""The `tokenizer.json` of a SentencePiece tokenizer transformers has no converter for
(fx2onnx/hub/shared/sentencepiece_tokenizer.py): SpeechT5Tokenizer's character model, built
here with protobuf, against transformers' SpeechT5Tokenizer (which runs the `sentencepiece`
library), through `write_folder_tokenizer` as export-hf writes a folder's tokenizer."""

from __future__ import annotations

import json
import warnings

import pytest

from fx2onnx.hub.shared import tokenizer_files
from fx2onnx.hub.shared.sentencepiece_tokenizer import read_sentencepiece_model, source_added_tokens
from fx2onnx.hub.shared.tokenizer_files import CHECKED_STRINGS, TokenizerMismatchWarning, file_encoder, write_folder_tokenizer
from sentencepiece_models import MAPPED, char_model, speecht5_tokenizer_folder, trained_char_model
from sentencepiece_models import STRINGS as SPECIAL_STRINGS

transformers = pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")  # transformers' SpeechT5Tokenizer, the reference, runs it

STRINGS = [*CHECKED_STRINGS, *SPECIAL_STRINGS]


@pytest.mark.parametrize("old_files", [False, True], ids=["transformers-5-files", "transformers-4-files"])
def test_tokenizer_json_encodes_as_speecht5_tokenizer(tmp_path, old_files):
    """With and without the special tokens: the ids transformers' SpeechT5Tokenizer gives; the
    source's own files kept; written from the model file, checked at export without a difference."""
    speecht5_tokenizer_folder(tmp_path / "source", old_files=old_files)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "source")
    (tmp_path / "out").mkdir()
    said: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", TokenizerMismatchWarning)
        written = write_folder_tokenizer(tmp_path / "source", tmp_path / "out", False, said.append)
    assert {"tokenizer.json", "spm_char.model", "tokenizer_config.json"} <= set(written)
    assert said == ["tokenizer.json: written from the SentencePiece model file"]
    for special in (True, False):
        encode = file_encoder(tmp_path / "out" / "tokenizer.json", special)
        assert [encode(text) for text in STRINGS] == [tokenizer(text, add_special_tokens=special)["input_ids"]
                                                      for text in STRINGS]
    ids = tokenizer("Hello, THE fox.")["input_ids"]
    assert ids[-1] == tokenizer.eos_token_id and tokenizer.unk_token_id in ids  # the capital E is no piece
    assert tokenizer("d<ctc_blank>")["input_ids"][-2] == len(tokenizer) - 1  # <ctc_blank>, after the pieces


def test_tokenizer_json_of_a_character_map_encodes_as_speecht5_tokenizer(tmp_path):
    """A character model SentencePiece's trainer wrote with the `nmt_nfkc` rule's character
    map (a `Precompiled` normalizer): transformers' ids, checked at export without a difference."""
    speecht5_tokenizer_folder(tmp_path / "source", trained_char_model(), old_files=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "source")
    (tmp_path / "out").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("error", TokenizerMismatchWarning)
        write_folder_tokenizer(tmp_path / "source", tmp_path / "out", False, lambda line: None)
    assert json.loads((tmp_path / "out" / "tokenizer.json").read_text())["normalizer"]["normalizers"][0]["type"] == "Precompiled"
    encode = file_encoder(tmp_path / "out" / "tokenizer.json")
    assert [encode(text) for text in STRINGS + [*MAPPED]] == [tokenizer(text)["input_ids"] for text in STRINGS + [*MAPPED]]


def test_numbers_spelt_out_are_said_and_the_check_finds_them(tmp_path):
    """SpeechT5Tokenizer's `normalize: true` (numbers in words) is left out of tokenizer.json:
    said, and the export's check (CHECKED_STRINGS and SENTENCEPIECE_STRINGS) names the strings
    with digits."""
    speecht5_tokenizer_folder(tmp_path / "source")
    config_path = tmp_path / "source" / "tokenizer_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "normalize": True}))
    (tmp_path / "out").mkdir()
    said: list[str] = []
    with pytest.warns(TokenizerMismatchWarning, match="'the lazy fox jumps 42 times in 2024': transformers"):
        write_folder_tokenizer(tmp_path / "source", tmp_path / "out", False, said.append)
    assert any(line.startswith("WARNING tokenizer.json leaves out numbers spelt out in English") for line in said)
    assert any(line.startswith("WARNING the tokenizer differs from transformers on 'the lazy fox") for line in said)
    # the SentencePiece strings are checked too: the one with digits differs
    assert any(line.startswith("WARNING the tokenizer differs from transformers on \"Hello, THE Fox's") for line in said)


def test_without_transformers_tokenizer_it_is_written_unchecked(tmp_path, monkeypatch):
    """Where transformers cannot load the tokenizer (no `sentencepiece`), tokenizer.json is
    written from the model file all the same, and said to be unchecked."""
    speecht5_tokenizer_folder(tmp_path / "source")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "source")

    def cannot_load(folder):
        raise ImportError("SpeechT5Tokenizer requires the SentencePiece library")

    monkeypatch.setattr(tokenizer_files, "load_tokenizer", cannot_load)
    (tmp_path / "out").mkdir()
    said: list[str] = []
    write_folder_tokenizer(tmp_path / "source", tmp_path / "out", False, said.append)
    assert said[-1].startswith("WARNING tokenizer.json not checked against transformers' tokenizer")
    encode = file_encoder(tmp_path / "out" / "tokenizer.json")
    assert [encode(text) for text in CHECKED_STRINGS] == [tokenizer(text)["input_ids"] for text in CHECKED_STRINGS]


def test_models_it_cannot_write_are_copied_with_the_reason(tmp_path):
    """A unigram model, and a file that is no SentencePiece model: the source's files as they
    are, no tokenizer.json, a warning naming why."""
    for name, model, reason in (("unigram", char_model(model_type=1), "SentencePiece UNIGRAM model"),
                                ("broken", b"model", "not a SentencePiece model")):
        source, out = tmp_path / name, tmp_path / f"{name}-out"
        source.mkdir()
        out.mkdir()
        (source / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "SpeechT5Tokenizer"}))
        (source / "spm_char.model").write_bytes(model)
        said: list[str] = []
        with pytest.warns(TokenizerMismatchWarning, match=reason):
            written = write_folder_tokenizer(source, out, False, said.append)
        assert sorted(written) == ["spm_char.model", "tokenizer_config.json"] and not (out / "tokenizer.json").exists()
        assert said[0].startswith("WARNING tokenizer files copied as they are")


def test_added_tokens_from_either_files(tmp_path):
    """The added tokens by id, from transformers 5's tokenizer_config.json and from
    transformers 4's added_tokens.json and special_tokens_map.json: the same ids, matched
    in the text as written."""
    found = []
    for old_files in (False, True):
        folder = tmp_path / str(old_files)
        speecht5_tokenizer_folder(folder, old_files=old_files)
        tokens = source_added_tokens(folder, read_sentencepiece_model(folder / "spm_char.model"))
        found.append({index: (token["content"], token["special"]) for index, token in tokens.items()})
        assert not any(token["normalized"] for token in tokens.values())
    pieces = 5 + 24
    assert found[0] == found[1] == {0: ("<s>", True), 1: ("<pad>", True), 2: ("</s>", True), 3: ("<unk>", True),
                                    pieces: ("<mask>", True), pieces + 1: ("<ctc_blank>", False)}
