"""The parts of a `tokenizer.json` written for one of transformers' Python tokenizers (no
`tokenizers` backend: VITS's, the CTC heads'), which Transformers.js and the `tokenizers`
library read: the tokenizer's added tokens, and the file saved beside the tokenizer's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def added_tokens(tokenizer: Any, **overrides: Any) -> list[dict[str, Any]]:
    """The tokenizer's added tokens as `tokenizer.json` lists them, with ``overrides`` of
    their fields (`special=False`)."""
    return [
        {"id": index, "content": token.content, "single_word": token.single_word, "lstrip": token.lstrip,
         "rstrip": token.rstrip, "normalized": token.normalized, "special": token.special, **overrides}
        for index, token in sorted(tokenizer.added_tokens_decoder.items())
    ]


def write_with_tokenizer_json(tokenizer: Any, tokenizer_json: dict[str, Any], destination: Path) -> list[str]:
    """Save ``tokenizer`` (its own files: `vocab.json`, `tokenizer_config.json`) and
    ``tokenizer_json`` as `tokenizer.json` into ``destination``; the names of the files written there."""
    written = [Path(path).name for path in tokenizer.save_pretrained(destination) if Path(path).parent == destination]
    (destination / "tokenizer.json").write_text(json.dumps(tokenizer_json, ensure_ascii=False, indent=2) + "\n",
                                                encoding="utf-8")
    return [*dict.fromkeys([*written, "tokenizer.json"])]
