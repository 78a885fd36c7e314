"""The sweep's tables on the export-hf guide's task pages (docs/guides/export-hf/*.md).

A page asks for a task's table with a pair of markers; `write_tables` fills what lies
between them from the sweep's records (bench/architecture_sweep.jsonl) and the clients'
(bench/sweep_clients.jsonl), one row per architecture: export-hf's result in onnxruntime,
then each client's. The rest of the page is written by hand. `python
bench/architecture_sweep.py --write-docs` writes these tables with the scoreboard.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

# the markers a page puts around a task's table; the text between them is replaced
START = "<!-- sweep table: {task} (written by bench/architecture_sweep.py --write-docs) -->"
END = "<!-- end of the sweep table -->"
MARKED = re.compile(r"<!-- sweep table: (?P<task>[\w-]+) \(written by [^)]*\) -->\n.*?<!-- end of the sweep table -->",
                    re.S)

# a record's cell for export-hf (exact, differs, fails: its class) and for the clients
ExportCell = Callable[[dict[str, Any]], str]
ClientCells = Callable[[dict[str, Any], dict[tuple[str, str], dict[str, Any]]], tuple[str, str]]


def task_table(task: str, records: list[dict[str, Any]], clients: dict[tuple[str, str], dict[str, Any]],
               export_cell: ExportCell, client_cells: ClientCells) -> list[str]:
    """A task's counts and its table of architectures; ONNX Runtime GenAI's column for text
    generation only (the other folders are not its)."""
    mine = sorted((r for r in records if r["task"] == task), key=lambda r: r["architecture"])
    built = [r for r in mine if r["status"] != "not built"]
    exported = [r for r in built if r["status"] == "exported"]
    generation = task == "text-generation"
    # a folder the clients' run could not build again is not counted (as on the scoreboard)
    runs = [c for r in exported if (c := clients.get((task, r["architecture"]))) and c.get("rebuilt") != "failed"]
    counts = (f"{len(built)} architectures tried, {len(exported)} exported, "
              f"{sum(bool(r.get('exact')) for r in exported)} exact in onnxruntime. ")
    classed = [c for c in runs if c.get("js") not in (None, "not supported")]
    if not runs:
        counts += "Not run in the clients yet."
    else:
        counts += (f"Of the {len(runs)} folders run in the clients, Transformers.js has a class for {len(classed)}: "
                   f"{sum(bool(c.get('js_exact')) for c in classed)} exact")
        genai = [c for c in runs if "genai_type" in c]
        counts += (f"; ONNX Runtime GenAI ran the {len(genai)} with a `genai_config.json`: "
                   f"{sum(bool(c.get('genai_exact')) for c in genai)} exact." if generation else ".")
    rows = [f"{counts} Each pair's time, memory, nodes and torch.onnx's result: "
            f"the [scoreboard](../../scoreboard.md#{task}).", "",
            "| architecture | export-hf | largest difference | Transformers.js |" + (" ONNX Runtime GenAI |" if generation else ""),
            "|---|---|---|---|" + ("---|" if generation else "")]
    for r in mine:
        if r["status"] == "not built":
            continue
        js, genai = client_cells(r, clients) if r["status"] == "exported" else ("", "")
        difference = f"{r['difference']:.2g}" if r.get("difference") is not None else ""
        rows.append(f"| {r['architecture']} | {export_cell(r)} | {difference} | {js} |" + (f" {genai} |" if generation else ""))
    return rows


def write_tables(folder: Path, records: list[dict[str, Any]], clients: dict[tuple[str, str], dict[str, Any]],
                 export_cell: ExportCell, client_cells: ClientCells) -> list[Path]:
    """Fill every marked table of the pages in ``folder``; returns the pages rewritten. A
    marker naming a task the records do not hold is an error (a misspelt task would
    otherwise leave the table empty)."""
    tasks = {r["task"] for r in records}
    written = []
    for page in sorted(folder.glob("*.md")):
        text = page.read_text(encoding="utf-8")

        def table(match: re.Match[str]) -> str:
            task = match["task"]
            if task not in tasks:
                raise ValueError(f"{page.name} asks for the sweep table of {task!r}, which the results do not hold "
                                 f"(tasks: {', '.join(sorted(tasks))})")
            body = task_table(task, records, clients, export_cell, client_cells)
            return "\n".join([START.format(task=task), "", *body, "", END])

        new = MARKED.sub(table, text)
        if new != text:
            page.write_text(new, encoding="utf-8")
            written.append(page)
    return written
