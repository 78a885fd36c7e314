"""The CTC heads' `tokenizer.json` (fx2onnx/hub/speech/ctc_tokenizer.py), without exporting:
the `tokenizers` library reads from it the ids `Wav2Vec2CTCTokenizer` encodes and the text
it decodes a CTC model's picks to (as transformers' speech recognition pipeline does: the
special tokens kept, grouped, the blank dropped). Transformers.js's pipeline on it:
tests/e2e/test_export_hf_padded_audio_architectures.py."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from fx2onnx.hub.shared.tokenizer_files import CHECKED_STRINGS, file_encoder, write_tokenizer
from fx2onnx.hub.shared.tokenizer_backend import python_added_tokens, vocabulary_with
from fx2onnx.hub.speech.ctc_tokenizer import ctc_backend, skipped_steps

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

# a released English checkpoint's vocabulary: the blank, the special tokens, the delimiter, letters, the apostrophe
VOCABULARY = ["<pad>", "<s>", "</s>", "<unk>", "|", *"ETAONIHSRDLUMWCFGYPBVK'XJQZ"]


def ctc_tokenizer(folder, **settings):
    (folder / "vocab.json").write_text(json.dumps({c: i for i, c in enumerate(VOCABULARY)}), encoding="utf-8")
    return transformers.Wav2Vec2CTCTokenizer(str(folder / "vocab.json"), **settings)


def test_tokenizer_json_encodes_as_the_ctc_tokenizer(tmp_path):
    tokenizer = ctc_tokenizer(tmp_path)
    written = write_tokenizer(tokenizer, tmp_path / "out")
    assert {"tokenizer.json", "vocab.json", "tokenizer_config.json"} <= set(written)
    strings = [*CHECKED_STRINGS, "HELLO THE FOX'S WORLD", "A  B\tC\nD", "<s>THE</s> <unk>", ""]
    encode = file_encoder(tmp_path / "out" / "tokenizer.json")
    assert [encode(text) for text in strings] == [tokenizer(text)["input_ids"] for text in strings]


def test_a_token_added_to_the_tokenizer_keeps_its_id(tmp_path):
    """A token added after the vocabulary: the id transformers gives it, matched whole, decoded
    back; an added token the vocabulary holds under another id is refused."""
    tokenizer = ctc_tokenizer(tmp_path)
    tokenizer.add_tokens(["<laugh>"])
    write_tokenizer(tokenizer, tmp_path / "out")
    written = tokenizers.Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    assert written.token_to_id("<laugh>") == tokenizer.convert_tokens_to_ids("<laugh>") == len(VOCABULARY)
    text = "THE <laugh> FOX"
    assert written.encode(text).ids == tokenizer(text)["input_ids"]
    assert written.decode(written.encode(text).ids, skip_special_tokens=False) == tokenizer.decode(tokenizer(text)["input_ids"])
    with pytest.raises(ValueError, match="'<pad>' has id 3, its vocabulary entry 0"):
        vocabulary_with({"<pad>": 0}, {3: {"content": "<pad>"}})


def test_tokenizer_json_decodes_picks_as_the_pipeline(tmp_path):
    """Greedy picks with repeats, blanks between repeats, delimiters and the special tokens:
    the text of `decode(ids)` with the special tokens kept (transformers' CTC pipeline)."""
    tokenizer = ctc_tokenizer(tmp_path)
    write_tokenizer(tokenizer, tmp_path / "out")
    written = tokenizers.Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    assert written.get_added_tokens_decoder() and not any(t.special for t in written.get_added_tokens_decoder().values())
    rng = np.random.default_rng(0)
    picks = [[5, 5, 0, 5, 6, 4, 4, 7, 0, 0, 8], [0, 1, 9, 9, 4, 2, 3, 10, 0]]
    picks += [rng.integers(0, len(VOCABULARY), 40).tolist() for _ in range(20)]
    for ids in picks:
        # the `tokenizers` library's CTC decoder keeps the spaces of delimiters at the ends, which
        # transformers and Transformers.js's decoder (`.trim()`) strip
        assert written.decode(ids, skip_special_tokens=False).strip() == tokenizer.decode(ids)


def test_no_delimiter_and_casing_left_out(tmp_path):
    """A tokenizer without a word delimiter writes no normalizer; one that upper-cases its
    text (do_lower_case) says what its tokenizer.json leaves out."""
    tokenizer = ctc_tokenizer(tmp_path, word_delimiter_token=None)
    written = json.loads(ctc_backend(tokenizer).to_str())
    assert written["normalizer"] is None and written["decoder"]["cleanup"] is False
    delimited = ctc_tokenizer(tmp_path)  # its added tokens (the delimiter special) written unmarked
    assert any(t["special"] for t in python_added_tokens(delimited).values())
    assert not any(t["special"] for t in json.loads(ctc_backend(delimited).to_str())["added_tokens"])
    cased = ctc_tokenizer(tmp_path, do_lower_case=True)
    assert skipped_steps(cased) and not skipped_steps(tokenizer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write_tokenizer(cased, tmp_path / "cased")
    assert any("do_lower_case" in str(w.message) for w in caught)


def test_a_grouping_tokenizer_gets_ctc_decoding(tmp_path):
    """A `ParakeetTokenizer` (a `tokenizers` backend; transformers groups a CTC head's picks
    and drops the blank in Python): its tokenizer.json, the `CTC` decoder put before its
    own, decodes the picks as `decode(ids)` does; a transducer's folder (no CTC head) keeps
    its decoder."""
    from fx2onnx.hub.speech.ctc_tokenizer import ctc_head, decode_as_ctc

    words = ["<unk>", "▁he", "llo", "▁w", "or", "ld", "▁", "<pad>"]
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.decoder = tokenizers.decoders.Metaspace()
    backend.add_special_tokens(["<unk>", "<pad>"])
    tokenizer = transformers.ParakeetTokenizer(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>")
    written = json.loads(backend.to_str())
    assert decode_as_ctc(tokenizer, written) and not decode_as_ctc(tokenizer, written)  # once
    assert written["decoder"]["decoders"][0]["type"] == "CTC" and not any(t["special"] for t in written["added_tokens"])
    assert not decode_as_ctc(ctc_tokenizer(tmp_path), json.loads(backend.to_str()))  # not a grouping tokenizer
    grouped = tokenizers.Tokenizer.from_str(json.dumps(written))
    rng = np.random.default_rng(1)
    for ids in [[1, 1, 7, 1, 2, 2, 7, 7, 3, 4, 4, 5, 0], *(rng.integers(0, len(words), 30).tolist() for _ in range(20))]:
        assert grouped.decode(ids, skip_special_tokens=False) == tokenizer.decode(ids)
    for architectures, expected in ((["ParakeetForCTC"], True), (["ParakeetForTDT"], False), (None, False)):
        (tmp_path / "config.json").write_text(json.dumps({"architectures": architectures}), encoding="utf-8")
        assert ctc_head(tmp_path) is expected
