"""A plain-text report of errors and warnings, for exception messages and terminals."""

from __future__ import annotations

from collections.abc import Sequence

from diagnostics.diagnostic import Diagnostic
from diagnostics.levels import Level
from diagnostics.rule import Rule


def summary_text(diagnostics: Sequence[Diagnostic]) -> str:
    """List every error, then every warning, then each involved rule's help once.

    Example line: ``- [FXE0011] No ONNX function ... (at /src/model.py:12)``.
    """
    errors = [d for d in diagnostics if d.level >= Level.ERROR]
    warnings = [d for d in diagnostics if d.level == Level.WARNING]
    if not errors and not warnings:
        return "No errors or warnings."
    lines: list[str] = []
    for title, group in (("error", errors), ("warning", warnings)):
        if group:
            lines.append(f"{_count(len(group), title)}:")
            lines.extend(_line(d) for d in group)
    lines.append("What to do:")
    for rule in _unique_rules(errors + warnings):
        lines.append(f"- [{rule.id}] {rule.name}: {rule.help_text}")
    return "\n".join(lines)


def _line(diagnostic: Diagnostic) -> str:
    # Indent continuation lines so a multi-line message stays inside its list item.
    message = diagnostic.message.strip().replace("\n", "\n  ")
    where = f" (at {diagnostic.location})" if diagnostic.location else ""
    return f"- [{diagnostic.rule.id}] {message}{where}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _unique_rules(diagnostics: Sequence[Diagnostic]) -> list[Rule]:
    return list({d.rule.id: d.rule for d in reversed(diagnostics)}.values())[::-1]


def warning_kinds(diagnostics: Sequence[Diagnostic]) -> list[tuple[Rule, list[Diagnostic]]]:
    """The warnings grouped by rule, in order of first appearance."""
    groups: dict[str, tuple[Rule, list[Diagnostic]]] = {}
    for diagnostic in diagnostics:
        if diagnostic.level == Level.WARNING:
            groups.setdefault(diagnostic.rule.id, (diagnostic.rule, []))[1].append(diagnostic)
    return list(groups.values())


def kind_text(rule: Rule, group: Sequence[Diagnostic]) -> str:
    """One warning kind as one message: count, rule, the first occurrence and its line."""
    first = group[0]
    where = f" (at {first.location})" if first.location else ""
    more = f" (and {len(group) - 1} more like it)" if len(group) > 1 else ""
    return f"[{rule.id}] {rule.name}: {_count(len(group), 'warning')}; first: {first.message.strip()}{where}{more}"


def warnings_line(diagnostics: Sequence[Diagnostic]) -> str:
    """One line: how many warnings of which rules, e.g. ``2 warnings: 2x FXE0014``."""
    kinds = warning_kinds(diagnostics)
    if not kinds:
        return "No warnings."
    total = sum(len(group) for _, group in kinds)
    parts = ", ".join(f"{len(group)}x {rule.id} {rule.name}" for rule, group in kinds)
    return f"{_count(total, 'warning')}: {parts}."
