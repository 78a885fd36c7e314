"""The folder's tokenizer files, written from the tokenizer transformers loads for the
source: what `AutoTokenizer.from_pretrained(source)` encodes with is its backend
(a `tokenizers` pipeline that transformers may build from the tokenizer's class rather
than take from the source's `tokenizer.json`, e.g. Qwen2's digit-by-digit split), and
that backend is what `tokenizer.json` holds here, for ONNX Runtime GenAI's tokenizer
and Transformers.js, which read that file.

Checked at export: a few strings (digits, spaces, non-ASCII) encoded with transformers
and with the written `tokenizer.json`; a difference is a warning naming the string and
both encodings.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from fx2onnx.hub.folder_files import TOKENIZER_FILES

# the strings the written tokenizer is checked on: digits, runs of spaces, non-ASCII
CHECKED_STRINGS = ("the lazy fox jumps 42 times in 2024", "  two  spaces,\ta tab and\nnew line ", "naïve café, 東京 🦊")


class TokenizerMismatchWarning(UserWarning):
    """The written tokenizer.json encodes a string differently from transformers."""


def has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(folder: Path) -> Any:
    """The tokenizer transformers loads for ``folder``."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def write_tokenizer(tokenizer: Any, destination: Path) -> list[str]:
    """Save ``tokenizer`` (its backend as `tokenizer.json`) into ``destination``; returns
    the names of the files written there."""
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise ValueError(
            f"transformers loads {type(tokenizer).__name__} for this model, without a `tokenizers` backend: "
            "there is no tokenizer.json that encodes as it does for ONNX Runtime GenAI and Transformers.js."
        )
    return [Path(path).name for path in tokenizer.save_pretrained(destination) if Path(path).parent == destination]


def encoding_differences(tokenizer: Any, tokenizer_json: Path) -> list[str]:
    """For each checked string that `tokenizer_json` (read by the `tokenizers` library, as
    the runtimes read it) encodes differently from ``tokenizer``: a line naming both."""
    from tokenizers import Tokenizer

    written = Tokenizer.from_file(str(tokenizer_json))
    lines = []
    for text in CHECKED_STRINGS:
        expected = list(tokenizer(text)["input_ids"])
        actual = written.encode(text).ids
        if actual != expected:
            lines.append(f"{text!r}: transformers {expected}, tokenizer.json {actual}")
    return lines


def check_written_tokenizer(tokenizer: Any, tokenizer_json: Path) -> list[str]:
    """Warn (TokenizerMismatchWarning) when the written file encodes a checked string
    differently from transformers; returns the differences."""
    differences = encoding_differences(tokenizer, tokenizer_json)
    if differences:
        warnings.warn(
            f"The folder's tokenizer.json does not encode as transformers' {type(tokenizer).__name__} does, so "
            f"ONNX Runtime GenAI and Transformers.js would give other token ids: {'; '.join(differences)}.",
            TokenizerMismatchWarning, stacklevel=2,
        )
    return differences
