"""The small JSON files of a model's folder (config, generation config, processor and
tokenizer settings): read with an error that names the file when it is missing or not
JSON, and written in one step (diagnostics' `write_atomically`) in one format: indented
by 2, the text as it is (no `\\u` escapes, as transformers writes its tokenizer files), a
final newline."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diagnostics import write_atomically


def read_json(path: Path) -> Any:
    """The content of the JSON file ``path``: FileNotFoundError when it is missing,
    ValueError when it is not JSON (UTF-8 text), each naming the file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as error:
        raise FileNotFoundError(f"'{path}' is missing: the JSON file cannot be read.") from error
    except UnicodeDecodeError as error:
        raise ValueError(f"'{path}' is not JSON: it is not UTF-8 text ({error.reason} at byte {error.start}).") from error
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"'{path}' is not JSON: {error.msg} at line {error.lineno}, column {error.colno}. "
                         "Fix the file or save it again with the library that wrote it.") from error


def read_json_if_present(path: Path, default: Any = None) -> Any:
    """The content of the JSON file ``path`` (read_json), ``default`` where there is no such file."""
    return read_json(path) if Path(path).is_file() else default


def write_json_file(folder: Path, name: str, content: Any) -> str:
    """Write ``content`` as ``folder``'s JSON file ``name`` in one step; returns ``name``."""
    write_atomically(Path(folder) / name, json.dumps(content, indent=2, ensure_ascii=False) + "\n")
    return name


def edit_json_file(path: Path, edit: Callable[[Any], bool]) -> bool:
    """Read the JSON file ``path``, let ``edit`` change its content in place (it returns
    whether it did) and write it back; returns whether the file changed."""
    content = read_json(path)
    if not edit(content):
        return False
    write_json_file(Path(path).parent, Path(path).name, content)
    return True
