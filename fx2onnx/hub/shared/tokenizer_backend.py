"""The `tokenizer.json` fx2onnx builds for a tokenizer that has none (VITS's and the CTC
heads' Python tokenizers, SpeechT5's SentencePiece model), built with the `tokenizers`
library (whose file Transformers.js reads too): the tokenizer's added tokens at their ids,
and the file written in one step beside the tokenizer's own files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diagnostics import write_atomically

TOKENIZER_JSON = "tokenizer.json"


def python_added_tokens(tokenizer: Any, **overrides: Any) -> dict[int, dict[str, Any]]:
    """The added tokens of ``tokenizer`` (one of transformers' Python tokenizers) by id, as
    the `tokenizers` library's `AddedToken` arguments, with ``overrides`` of them (`special=False`)."""
    return {
        index: {"content": token.content, "single_word": token.single_word, "lstrip": token.lstrip,
                "rstrip": token.rstrip, "normalized": token.normalized, "special": token.special, **overrides}
        for index, token in sorted(tokenizer.added_tokens_decoder.items())
    }


def vocabulary_with(vocab: dict[str, int], added: dict[int, dict[str, Any]]) -> dict[str, int]:
    """``vocab`` with each ``added`` token (by id) at its id: the `tokenizers` library gives an
    added token its vocabulary id, else the next free one. ValueError for a token the
    vocabulary holds under another id."""
    merged = dict(vocab)
    for index, token in added.items():
        if merged.setdefault(token["content"], index) != index:
            raise ValueError(f"the added token {token['content']!r} has id {index}, its vocabulary entry "
                             f"{merged[token['content']]}.")
    return merged


def add_tokens(backend: Any, added: dict[int, dict[str, Any]]) -> None:
    """Add the ``added`` tokens (by id, their ids in the model's vocabulary: vocabulary_with) to
    the `tokenizers.Tokenizer` ``backend``, matched in the text before its other steps."""
    from tokenizers import AddedToken

    backend.add_tokens([AddedToken(**token) for _, token in sorted(added.items())])


def write_backend(backend: Any, destination: Path) -> list[str]:
    """Write the `tokenizers.Tokenizer` ``backend`` as ``destination``'s `tokenizer.json` (as
    the library saves it, in one step); returns its name, in a list."""
    write_atomically(destination / TOKENIZER_JSON, backend.to_str(pretty=True))
    return [TOKENIZER_JSON]


def write_with_backend(tokenizer: Any, backend: Any, destination: Path) -> list[str]:
    """Save ``tokenizer`` (its own files: `vocab.json`, `tokenizer_config.json`) and ``backend``
    as `tokenizer.json` into ``destination``; the names of the files written there."""
    written = [Path(path).name for path in tokenizer.save_pretrained(destination) if Path(path).parent == destination]
    return [*dict.fromkeys([*written, *write_backend(backend, destination)])]
