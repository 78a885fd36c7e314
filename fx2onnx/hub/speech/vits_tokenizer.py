"""A `tokenizer.json` for transformers' `VitsTokenizer` (VITS, MMS-TTS), which has none.

`VitsTokenizer` is a Python tokenizer: a text is lowercased, stripped of the characters
its vocabulary lacks and of the spaces at its ends (``normalize``), cut into characters,
and the vocabulary's token 0 put between and around them (``add_blank``). Transformers.js
(and the `tokenizers` library) read that from `tokenizer.json`: normalizers that do the
same (`Lowercase`, a `Replace` of every character outside the vocabulary, `Strip`, a
`Replace` of the empty match, at every position, by token 0), a `Split` isolating each
character (or token 0), and a `WordLevel` vocabulary (Transformers.js maps the pieces
through it as they are). What it cannot do is said, not written: a tokenizer that
phonemizes its text (eSpeak) or romanizes it (uroman) is written without that step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fx2onnx.hub.shared.tokenizer_backend import add_tokens, python_added_tokens, vocabulary_with, write_with_backend

# characters with a meaning in a regular expression, escaped both in Oniguruma (the
# `tokenizers` library) and JavaScript with the `u` flag (which refuses other escapes)
_SYNTAX = set("^$\\.*+?()[]{}|/-")
VITS_TOKENIZER = "VitsTokenizer"


def is_vits_tokenizer(tokenizer: Any) -> bool:
    return type(tokenizer).__name__ == VITS_TOKENIZER


def _escaped(text: str) -> str:
    return "".join(f"\\{char}" if char in _SYNTAX else char for char in text)


def skipped_steps(tokenizer: Any) -> list[str]:
    """What ``tokenizer`` does that its `tokenizer.json` cannot (its clients' text must come so prepared)."""
    steps = []
    if getattr(tokenizer, "phonemize", False):
        steps.append("phonemization (eSpeak through `phonemizer`: give the clients phonemes)")
    if getattr(tokenizer, "is_uroman", False):
        steps.append("romanization (uroman: give the clients romanized text)")
    return steps


def vits_backend(tokenizer: Any) -> Any:
    """The `tokenizers.Tokenizer` that encodes as ``tokenizer`` (a `VitsTokenizer`) does, bar :func:`skipped_steps`."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

    added = python_added_tokens(tokenizer)
    vocab = dict(tokenizer.encoder)
    blank = tokenizer.convert_ids_to_tokens(0)
    steps: list[Any] = []
    if tokenizer.normalize:
        # normalize_text lowercases what is no vocabulary entry: the same where no entry has capitals
        steps.append(normalizers.Lowercase())
    if tokenizer.language == "ron":  # _preprocess_char: Romanian's t with comma below as its cedilla form
        steps.append(normalizers.Replace("ț", "ţ"))
    if tokenizer.normalize and not tokenizer.phonemize:
        characters = "".join(_escaped(token) for token in vocab if len(token) == 1)
        steps += [normalizers.Replace(Regex(f"[^{characters}]"), ""), normalizers.Strip(left=True, right=True)]
    if tokenizer.add_blank:  # token 0 at every position: before each character and after the last
        steps.append(normalizers.Replace(Regex(""), blank))
    backend = Tokenizer(models.WordLevel(vocabulary_with(vocab, added), unk_token=tokenizer.unk_token))
    if steps:
        backend.normalizer = normalizers.Sequence(steps)
    pieces = f"{_escaped(blank)}|." if len(blank) > 1 else "."
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(pieces), behavior="isolated", invert=False)
    # no decoder: Transformers.js decodes with its VitsTokenizer's own decoder
    add_tokens(backend, added)
    return backend


def write_vits_tokenizer(tokenizer: Any, destination: Path) -> list[str]:
    """Save ``tokenizer`` (its own files, `vocab.json` and `tokenizer_config.json`) and its
    `tokenizer.json` into ``destination``; returns the names of the files written there."""
    return write_with_backend(tokenizer, vits_backend(tokenizer), destination)
