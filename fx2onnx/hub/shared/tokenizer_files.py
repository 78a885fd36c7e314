"""The folder's tokenizer files, written from the tokenizer transformers loads for the
source: what `AutoTokenizer.from_pretrained(source)` encodes with is its backend
(a `tokenizers` pipeline that transformers may build from the tokenizer's class rather
than take from the source's `tokenizer.json`, e.g. Qwen2's digit-by-digit split), and
that backend is what `tokenizer.json` holds here, for ONNX Runtime GenAI's tokenizer
and Transformers.js, which read that file.

Checked at export: a few strings (digits, spaces, non-ASCII) encoded with transformers,
with the written `tokenizer.json` (the `tokenizers` library) and, in a causal LM's
folder where onnxruntime-genai is installed, with `og.Tokenizer(folder)` (which reads
the tokenizer files without loading the model); a difference is a
`TokenizerMismatchWarning` naming the string and both encodings.

A SentencePiece tokenizer transformers has no `tokenizers` backend for (SpeechT5Tokenizer)
keeps the source's files, with a `tokenizer.json` built from its model file
(`fx2onnx.hub.shared.sentencepiece_tokenizer`), checked where transformers loads the
tokenizer (with the `sentencepiece` library).
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fx2onnx.hub.shared.folder_files import TOKENIZER_FILES, copy_folder_files, name_tokenizer_class
from fx2onnx.hub.shared.json_files import edit_json_file
from fx2onnx.hub.shared.sentencepiece_tokenizer import sentencepiece_class, steps_left_out, write_sentencepiece_tokenizer
from fx2onnx.hub.speech.ctc_tokenizer import ctc_head, decode_as_ctc, is_ctc_tokenizer, write_ctc_tokenizer
from fx2onnx.hub.speech.vits_tokenizer import is_vits_tokenizer, write_vits_tokenizer

# the strings the written tokenizer is checked on: digits, runs of spaces, non-ASCII
CHECKED_STRINGS = ("the lazy fox jumps 42 times in 2024", "  two  spaces,\ta tab and\nnew line ", "naïve café, 東京 🦊")
# and a SentencePiece tokenizer written from its model file: capitals and punctuation, longer
# runs of spaces, SentencePiece's space piece in the text, the empty text
SENTENCEPIECE_STRINGS = ("Hello, THE Fox's tail: it is 3.45 (or 5)!", "   runs   of    spaces   ", "▁its space piece▁", "")

Encoder = Callable[[str], list[int]]


class TokenizerMismatchWarning(UserWarning):
    """A client's tokenizer, reading the folder, encodes a string differently from transformers."""


def has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(folder: Path) -> Any:
    """The tokenizer transformers loads for ``folder``."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def write_tokenizer(tokenizer: Any, destination: Path) -> list[str]:
    """Save ``tokenizer`` (its backend as `tokenizer.json`) into ``destination``; returns
    the names of the files written there (a `VitsTokenizer` or a `Wav2Vec2CTCTokenizer`,
    which have no backend, with the `tokenizer.json` that encodes as it does:
    `fx2onnx.hub.speech.vits_tokenizer`, `fx2onnx.hub.speech.ctc_tokenizer`)."""
    if is_vits_tokenizer(tokenizer):
        return write_vits_tokenizer(tokenizer, destination)
    if is_ctc_tokenizer(tokenizer):
        return write_ctc_tokenizer(tokenizer, destination)
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise ValueError(
            f"transformers loads {type(tokenizer).__name__} for this model, without a `tokenizers` backend: "
            "there is no tokenizer.json that encodes as it does for ONNX Runtime GenAI and Transformers.js."
        )
    written = [Path(path).name for path in tokenizer.save_pretrained(destination) if Path(path).parent == destination]
    template_in_tokenizer_config(destination)
    return written


def template_in_tokenizer_config(folder: Path) -> bool:
    """Copy the chat template of ``folder``'s `chat_template.jinja` into its
    `tokenizer_config.json` (as `chat_template`), where that has none; returns whether it
    did. transformers 5 saves a tokenizer's one template as chat_template.jinja alone, and
    Transformers.js's tokenizer (the pinned release, client_support.TRANSFORMERS_JS) reads
    only tokenizer_config.json's (`this.chat_template = tokenizerConfig.chat_template ?? null`
    in PreTrainedTokenizer's constructor), so its `apply_chat_template` would throw;
    transformers reads the .jinja file first, so both give it the same template."""
    template, config_path = folder / "chat_template.jinja", folder / "tokenizer_config.json"
    if not (template.is_file() and config_path.is_file()):
        return False

    def add_template(config: dict[str, Any]) -> bool:
        if config.get("chat_template") is not None:
            return False
        config["chat_template"] = template.read_text(encoding="utf-8")
        return True

    return edit_json_file(config_path, add_template)


def file_encoder(tokenizer_json: Path, special_tokens: bool = True) -> Encoder:
    """How a client reading ``tokenizer_json`` with the `tokenizers` library encodes."""
    from tokenizers import Tokenizer

    written = Tokenizer.from_file(str(tokenizer_json))
    return lambda text: written.encode(text, add_special_tokens=special_tokens).ids


def genai_encoder(folder: Path) -> Encoder | None:
    """How ONNX Runtime GenAI's tokenizer encodes with the folder's files (it needs the
    folder's genai_config.json); None where onnxruntime-genai is not installed."""
    if importlib.util.find_spec("onnxruntime_genai") is None:
        return None
    import onnxruntime_genai as og

    try:
        genai = og.Tokenizer(str(folder))
    except RuntimeError as error:  # a tokenizer it does not read: the folder generates, its text must be encoded apart
        warnings.warn(f"ONNX Runtime GenAI's tokenizer cannot read the folder's tokenizer: {error}", TokenizerMismatchWarning,
                      stacklevel=3)
        return None
    return lambda text: [int(token) for token in genai.encode(text)]


def check_encodings(tokenizer: Any, clients: dict[str, Encoder], special_tokens: bool = True,
                    strings: tuple[str, ...] = CHECKED_STRINGS) -> list[str]:
    """Warn (TokenizerMismatchWarning) for each of ``strings`` a client encodes differently
    from ``tokenizer`` (with its special tokens added, or without); returns the
    differences, one line each."""
    differences = []
    for text in strings:
        expected = list(tokenizer(text, add_special_tokens=special_tokens)["input_ids"])
        for client, encode in clients.items():
            actual = encode(text)
            if actual != expected:
                differences.append(f"{text!r}: transformers {expected}, {client} {actual}")
    if differences:
        warnings.warn(
            f"The folder's tokenizer does not encode as transformers' {type(tokenizer).__name__} does, so its "
            f"clients would get other token ids: {'; '.join(differences)}.", TokenizerMismatchWarning, stacklevel=2,
        )
    return differences


def write_folder_tokenizer(
    source: Path, staging: Path, for_genai: bool, say: Callable[[str], None], special_tokens: bool = True
) -> list[str]:
    """The tokenizer of ``source`` written into the folder ``staging`` and checked (with
    ONNX Runtime GenAI's tokenizer too when ``for_genai``: a folder whose genai_config.json
    is written; against transformers' encoding without its special tokens unless
    ``special_tokens``: Whisper's, whose prompt carries them); the source's files as they
    are when transformers cannot load its tokenizer. Returns the names of the files written."""
    if not has_tokenizer(source):
        return []
    if sentencepiece_class(source) is not None:
        return _write_sentencepiece_folder_tokenizer(source, staging, say, special_tokens)
    try:
        tokenizer = load_tokenizer(source)
        written = write_tokenizer(tokenizer, staging)
    except (OSError, ValueError, ImportError) as error:  # ImportError: a library the tokenizer needs (SentencePiece)
        warnings.warn(f"The tokenizer files are copied as they are: {error}", TokenizerMismatchWarning, stacklevel=2)
        say(f"WARNING tokenizer files copied as they are: {error}")
        return copy_folder_files(source, staging, TOKENIZER_FILES)
    if ctc_head(source) and edit_json_file(staging / "tokenizer.json", lambda found: decode_as_ctc(tokenizer, found)):
        say(f"tokenizer.json: {type(tokenizer).__name__}'s CTC decoding (repeats grouped, the blank dropped) in its decoder")
    clients = {"tokenizer.json": file_encoder(staging / "tokenizer.json", special_tokens)}
    if for_genai:
        tokenizer_class = name_tokenizer_class(staging)
        if tokenizer_class:
            say(f"tokenizer_config.json: tokenizer_class {tokenizer_class} (read by ONNX Runtime GenAI)")
        genai = genai_encoder(staging)
        if genai is not None:
            clients["og.Tokenizer"] = genai
    for difference in check_encodings(tokenizer, clients, special_tokens):
        say(f"WARNING the tokenizer differs from transformers on {difference}")
    return written


def _write_sentencepiece_folder_tokenizer(source: Path, staging: Path, say: Callable[[str], None],
                                          special_tokens: bool) -> list[str]:
    """A SentencePiece tokenizer transformers has no `tokenizers` backend for
    (`fx2onnx.hub.shared.sentencepiece_tokenizer`): the source's files as they are, with the
    `tokenizer.json` written from its model file, checked against transformers' tokenizer
    where transformers loads it (it needs the `sentencepiece` library)."""
    written = copy_folder_files(source, staging, TOKENIZER_FILES)
    try:
        written = [*dict.fromkeys([*written, *write_sentencepiece_tokenizer(source, staging)])]
    except ValueError as error:
        warnings.warn(f"The tokenizer files are copied as they are: {error}", TokenizerMismatchWarning, stacklevel=3)
        say(f"WARNING tokenizer files copied as they are: {error}")
        return written
    say("tokenizer.json: written from the SentencePiece model file")
    for step in steps_left_out(source):
        say(f"WARNING tokenizer.json leaves out {step}")
    try:
        tokenizer = load_tokenizer(source)
    except (OSError, ValueError, ImportError) as error:  # ImportError: transformers loads it with `sentencepiece` only
        say(f"WARNING tokenizer.json not checked against transformers' tokenizer, which does not load here: {error}")
        return written
    clients = {"tokenizer.json": file_encoder(staging / "tokenizer.json", special_tokens)}
    for difference in check_encodings(tokenizer, clients, special_tokens, (*CHECKED_STRINGS, *SENTENCEPIECE_STRINGS)):
        say(f"WARNING the tokenizer differs from transformers on {difference}")
    return written
