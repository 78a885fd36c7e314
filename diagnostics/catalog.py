"""The rule catalog as Markdown (`docs/rules.md`, kept equal to it by a test).

    python -m diagnostics.catalog > docs/rules.md
"""

from __future__ import annotations

from diagnostics import rules

_DISPATCH_CONTRACT = """\
## Dispatch decisions

Every operator node's dispatch decision is in every report, whatever the verbosity, at the
levels and rules the former `torch.onnx.dynamo_export` used; each result's message names
the node's target as torch prints it (`aten.add.Tensor`):

| decision | rule | level |
|---|---|---|
| an ONNX function whose signature fits the node's argument types exactly | FXE0014 | none |
| a node that needs no function (it returns its input unchanged, removed before translation) | FXE0014 | none |
| no exact fit: the nearest function, naming each input or attribute that did not fit | FXE0014 | warning |
| no function for the exact overload: the default overload's functions used | FXE0016 | warning |
| only real functions for a complex input (or only complex ones for a real input) | FXE0011 | error |
| no function at all, found by the analysis before translation | FXE0012 | error |

Below verbosity DEBUG the level-none records are short (no source line, no list of the
candidates tried); at DEBUG they carry both, and every pass and FX node has a record too.
"""


def _anchor(rule: rules.Rule) -> str:
    """The id of the rule's heading, as MkDocs and GitHub make it from `## FXE0012 name`."""
    return f"{rule.id}-{rule.name}".lower()


def catalog_markdown() -> str:
    lines = [
        "# Diagnostic rules",
        "",
        "Generated from `diagnostics/rules.py` (`python -m diagnostics.catalog`). Ids and names are",
        "stable: filter SARIF reports by them. Each rule's section gives its message (the fields",
        "in braces are filled in each result) and what to do.",
        "",
        "| id | name | default level | short description |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| [{r.id}](#{_anchor(r)}) | {r.name} | {r.default_level.sarif_level} | {r.short_description} |"
        for r in rules.ALL
    ]
    lines += ["", _DISPATCH_CONTRACT]
    for rule in rules.ALL:
        every = " Recorded at every verbosity." if rule.recorded_at_every_verbosity else ""
        lines += [
            f"## {rule.id} {rule.name}",
            "",
            rule.full_description + every,
            "",
            f"Default level: {rule.default_level.sarif_level}. Message:",
            "",
            "```text",
            rule.message_template,
            "```",
            "",
            f"What to do: {rule.help_text}",
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(catalog_markdown(), end="")
