"""The files beside the model: config, generation config and preprocessor files copied
from the source folder (the tokenizer's too when transformers cannot load it, see
tokenizer_files), a processor's settings read from them, the tokenizer's class named so
that ONNX Runtime GenAI's tokenizer reads it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from fx2onnx.hub.shared.json_files import edit_json_file, read_json, read_json_if_present

_COPIED = (
    "config.json", "generation_config.json", "chat_template.jinja", "preprocessor_config.json", "processor_config.json",
    "feature_extractor_config.json",
)
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt",
    "vocab.txt", "added_tokens.json", "spiece.model", "sentencepiece.bpe.model", "spm_char.model",
)
PREPROCESSOR_FILE, PROCESSOR_FILE = "preprocessor_config.json", "processor_config.json"
# transformers 5 names the class of every fast tokenizer TokenizersBackend, which the
# runtime does not know: it reads tokenizer.json under the name of a known class.
_GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast", None)


def copy_folder_files(source: Path, destination: Path, names: tuple[str, ...] = _COPIED) -> list[str]:
    """Copy the files of ``source`` the runtime and preprocessing need (those of ``names``
    it has); returns their names. A file ``destination`` has already (a recipe's, written for
    its client) is kept as it is."""
    copied = []
    for name in names:
        if (source / name).is_file() and not (destination / name).exists():
            shutil.copyfile(source / name, destination / name)
            copied.append(name)
    return copied


def _runtime_tokenizer_class(tokenizer_json: dict) -> str:
    """A class the runtime's tokenizer knows for this tokenizer.json: byte-level BPE is
    GPT-2's, SentencePiece-style (Metaspace) is LLaMA's."""
    text = json.dumps({k: tokenizer_json.get(k) for k in ("pre_tokenizer", "decoder", "normalizer")})
    return "LlamaTokenizer" if "Metaspace" in text or "Replace" in text else "GPT2Tokenizer"


def processor_file_settings(folder: Path, part: str) -> dict[str, Any] | None:
    """The settings of one of the folder's processors: `preprocessor_config.json`, or the
    ``part`` (`image_processor`, `feature_extractor`) of `processor_config.json`
    (transformers 5 saves a processor so, alone); None without either."""
    if (Path(folder) / PREPROCESSOR_FILE).is_file():
        return read_json(Path(folder) / PREPROCESSOR_FILE)
    return read_json_if_present(Path(folder) / PROCESSOR_FILE, {}).get(part)


def name_tokenizer_class(folder: Path) -> str | None:
    """Give tokenizer_config.json a class the runtime reads; returns the class set, or
    None when there is no fast tokenizer or the class is already specific."""
    config_path, tokenizer_path = folder / "tokenizer_config.json", folder / "tokenizer.json"
    if not (config_path.is_file() and tokenizer_path.is_file()):
        return None
    named: list[str] = []

    def name(config: dict[str, Any]) -> bool:
        if config.get("tokenizer_class") not in _GENERIC_CLASSES:
            return False
        config["tokenizer_class"] = _runtime_tokenizer_class(read_json(tokenizer_path))
        named.append(config["tokenizer_class"])
        return True

    edit_json_file(config_path, name)
    return named[0] if named else None
