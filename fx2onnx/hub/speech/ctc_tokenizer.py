"""A `tokenizer.json` for transformers' `Wav2Vec2CTCTokenizer` (the CTC heads of wav2vec2,
HuBERT, WavLM, UniSpeech, Data2VecAudio, SEW...), which has none.

`Wav2Vec2CTCTokenizer` is a Python tokenizer: a text's spaces become the word delimiter
(`|`) and the text is cut into characters, each looked up in `vocab.json` (the unknown
token for the others); the vocabulary's entries of several characters (`<pad>`, `<s>`) are
matched whole. Its decoding is CTC's: repeated tokens grouped, the blank (the padding
token) dropped, the delimiter turned into a space. Transformers.js needs `tokenizer.json`
to load a tokenizer, and its `automatic-speech-recognition` pipeline decodes a CTC model's
greedy picks with it (`tokenizer.decode(ids, {skip_special_tokens: true})`).

Built here with the `tokenizers` library: a `Replace` normalizer of the space by the
delimiter, a `Split` isolating each character, a `WordLevel` vocabulary, the entries of
several characters as added tokens, and the `CTC` decoder. transformers' speech recognition pipeline decodes a CTC
model's picks with the special tokens kept (grouped, then the blank dropped), whereas
Transformers.js drops the tokens `tokenizer.json` marks special before grouping (a
character repeated across a blank would be merged): the added tokens are written unmarked,
so that both group the same picks. Transformers.js's CTC decoder turns the delimiter into
a space only with its `cleanup` (whose joining of a space before punctuation comes first,
on the text before the delimiter is replaced: nothing to join where no token is a space).
What it cannot write is said (a warning), not written (:func:`skipped_steps`).

Parakeet's and LASR's tokenizers have a `tokenizers` backend, and their CTC decoding
(repeats grouped, the blank dropped) is Python code of theirs (`_decode`) before the
backend's decoder: for a CTC head's folder their `tokenizer.json` gets the `CTC` decoder
(no delimiter) before its own, its added tokens unmarked as above (:func:`decode_as_ctc`)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from fx2onnx.hub.shared.json_files import read_json_if_present
from fx2onnx.hub.shared.tokenizer_backend import add_tokens, python_added_tokens, vocabulary_with, write_with_backend

CTC_TOKENIZER = "Wav2Vec2CTCTokenizer"
# tokenizers with a `tokenizers` backend that decode a CTC head's picks in Python (`_decode`)
GROUPING_TOKENIZERS = frozenset({"ParakeetTokenizer", "LasrTokenizer"})
# every character, one piece each (`.` leaves out line breaks; JavaScript's regular
# expressions, which Transformers.js builds from the pattern, have no inline `(?s)`)
_CHARACTER = r"[\s\S]"


def is_ctc_tokenizer(tokenizer: Any) -> bool:
    return type(tokenizer).__name__ == CTC_TOKENIZER


def ctc_head(folder: Path) -> bool:
    """Whether the model of ``folder`` (its config.json) is a CTC head (`...ForCTC`); a
    Parakeet transducer shares the CTC head's tokenizer and decodes every token it emits."""
    architectures = read_json_if_present(Path(folder) / "config.json", {}).get("architectures")
    return any(str(name).endswith("ForCTC") for name in architectures or ())


def decode_as_ctc(tokenizer: Any, tokenizer_json: dict[str, Any]) -> bool:
    """Make ``tokenizer_json`` (the written `tokenizer.json` of ``tokenizer``, one of
    GROUPING_TOKENIZERS) decode a CTC head's picks as the tokenizer does, in place: the
    `CTC` decoder (grouping, the blank dropped) before the file's own, and no added token
    marked special. False, unchanged, for another tokenizer or a file that already decodes so."""
    decoder = tokenizer_json.get("decoder") or {}
    first = (decoder.get("decoders") or [{}])[0] if decoder.get("type") == "Sequence" else decoder
    if type(tokenizer).__name__ not in GROUPING_TOKENIZERS or first.get("type") == "CTC":
        return False
    ctc = {"type": "CTC", "pad_token": tokenizer.pad_token, "word_delimiter_token": "", "cleanup": False}
    tokenizer_json["decoder"] = {"type": "Sequence", "decoders": [ctc, *([decoder] if decoder else [])]}
    for token in tokenizer_json.get("added_tokens", []):
        token["special"] = False
    return True


def skipped_steps(tokenizer: Any) -> list[str]:
    """What ``tokenizer`` does that its `tokenizer.json` cannot (the `tokenizers` library
    has no upper-casing normalizer, nor a lower-casing decoder)."""
    if not tokenizer.do_lower_case:
        return []
    return ["do_lower_case's upper-casing of the text and lower-casing of the transcription"]


def ctc_backend(tokenizer: Any) -> Any:
    """The `tokenizers.Tokenizer` that encodes and decodes as ``tokenizer`` (a `Wav2Vec2CTCTokenizer`)
    does, bar :func:`skipped_steps`."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    # the token only where one is set (unset, `word_delimiter_token` logs an error)
    delimiter = tokenizer.word_delimiter_token if tokenizer.word_delimiter_token_id is not None else None
    added = python_added_tokens(tokenizer, normalized=False, special=False)
    backend = Tokenizer(models.WordLevel(vocabulary_with(dict(tokenizer.encoder), added), unk_token=tokenizer.unk_token))
    if delimiter is not None:
        backend.normalizer = normalizers.Replace(" ", delimiter)
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(_CHARACTER), behavior="isolated", invert=False)
    # Transformers.js's CTC decoder turns the delimiter into a space only with `cleanup`
    # (and, with it, an empty delimiter into spaces everywhere)
    backend.decoder = decoders.CTC(pad_token=tokenizer.pad_token, word_delimiter_token=delimiter or "",
                                   cleanup=delimiter is not None)
    add_tokens(backend, added)
    return backend


def write_ctc_tokenizer(tokenizer: Any, destination: Path) -> list[str]:
    """Save ``tokenizer`` (its own files, `vocab.json` and `tokenizer_config.json`) and its
    `tokenizer.json` into ``destination``; returns the names of the files written there."""
    steps = skipped_steps(tokenizer)
    if steps:
        warnings.warn(f"The folder's tokenizer.json leaves out {', '.join(steps)}: its clients' text is not cased "
                      f"as {CTC_TOKENIZER}'s.", stacklevel=2)
    return write_with_backend(tokenizer, ctc_backend(tokenizer), destination)
