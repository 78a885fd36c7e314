"""The one way the benchmarks hand over their results: the Markdown tables printed, and
written beside the raw results when asked (`--markdown`, `--json`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_report(text: str, results: Any, markdown: str | None, json_path: str | None) -> None:
    """Print ``text``; write it to ``markdown`` and ``results`` (as JSON) to ``json_path`` when given."""
    print(text)
    if markdown:
        Path(markdown).write_text(text + "\n", encoding="utf-8")
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
