"""Build a SARIF 2.1.0 log (as a plain dict) from diagnostics.

Explicit builders with literal camelCase keys: only absent (None) values are omitted,
``level`` is always written, so every consumer reads the same severity we meant.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from diagnostics.diagnostic import Diagnostic
from diagnostics.jsonsafe import json_safe
from diagnostics.levels import Level
from diagnostics.locations import Location, Stack
from diagnostics.rule import Rule
from diagnostics.uris import file_uri

SARIF_SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_VERSION = "2.1.0"


def sarif_log(
    tool_name: str,
    tool_version: str,
    diagnostics: Sequence[Diagnostic],
    information_uri: str | None = None,
) -> dict[str, Any]:
    """One SARIF log with one run holding ``diagnostics`` as results."""
    rules = _rules_in_first_use_order(diagnostics)
    index_of = {rule.id: index for index, rule in enumerate(rules)}
    driver: dict[str, Any] = {"name": tool_name, "version": tool_version}
    if information_uri:
        driver["informationUri"] = information_uri
    driver["rules"] = [rule_descriptor(rule) for rule in rules]
    run = {
        "tool": {"driver": driver},
        "invocations": [
            {"executionSuccessful": not any(d.level >= Level.ERROR for d in diagnostics)}
        ],
        "columnKind": "unicodeCodePoints",
        "results": [result(d, index_of[d.rule.id]) for d in diagnostics],
    }
    return {"$schema": SARIF_SCHEMA_URI, "version": SARIF_VERSION, "runs": [run]}


def to_json(log: dict[str, Any], indent: int | None = 2) -> str:
    """Serialize a SARIF log; refuses NaN/Infinity, which SARIF readers reject."""
    return json.dumps(log, ensure_ascii=False, allow_nan=False, indent=indent)


def rule_descriptor(rule: Rule) -> dict[str, Any]:
    """A SARIF ``reportingDescriptor`` for ``rule``."""
    return {
        "id": rule.id,
        "name": rule.name,
        "shortDescription": {"text": rule.short_description},
        "fullDescription": {"text": rule.full_description, "markdown": rule.full_description},
        "help": {"text": rule.help_text, "markdown": rule.help_text},
        "defaultConfiguration": {"level": rule.default_level.sarif_level},
    }


def result(diagnostic: Diagnostic, rule_index: int) -> dict[str, Any]:
    """A SARIF ``result`` for ``diagnostic``, whose rule is at ``rule_index``."""
    text = diagnostic.message or diagnostic.rule.short_description
    message: dict[str, Any] = {"text": text}
    log = diagnostic.markdown()
    message["markdown"] = f"{text}\n\n{log}" if log else text
    out: dict[str, Any] = {
        "ruleId": diagnostic.rule.id,
        "ruleIndex": rule_index,
        "level": diagnostic.level.sarif_level,
    }
    if diagnostic.level == Level.NONE:
        # Level none is for progress records, not problems (SARIF §3.27.9).
        out["kind"] = "informational"
    out["message"] = message
    primary = physical_location(diagnostic.location) if diagnostic.location else None
    if primary is not None:
        out["locations"] = [primary]
    if diagnostic.stack:
        out["stacks"] = [stack(diagnostic.stack)]
    if diagnostic.properties:
        out["properties"] = json_safe(diagnostic.properties)
    return out


def physical_location(location: Location) -> dict[str, Any] | None:
    """A SARIF ``location`` with a physicalLocation; None for pseudo-files (no valid URI)."""
    uri = file_uri(location.path)
    if uri is None:
        return None
    region: dict[str, Any] = {"startLine": max(location.line, 1)}
    if location.column is not None and location.column >= 1:
        region["startColumn"] = location.column
    if location.snippet:
        region["snippet"] = {"text": location.snippet}
    return {"physicalLocation": {"artifactLocation": {"uri": uri}, "region": region}}


def stack(value: Stack) -> dict[str, Any]:
    """A SARIF ``stack``. SARIF lists the innermost frame first, Python lists it last."""
    out: dict[str, Any] = {}
    if value.message:
        out["message"] = {"text": value.message}
    out["frames"] = [{"location": _frame_location(frame)} for frame in reversed(value.frames)]
    return out


def _frame_location(frame: Location) -> dict[str, Any]:
    location = physical_location(frame) or {}
    # Pseudo-files (<eval_with_key>.3) have no URI; the message keeps where they were.
    text = frame.function if location else f"{frame.function or '?'} ({frame.path}:{frame.line})"
    if text:
        location["message"] = {"text": text}
    return location


def _rules_in_first_use_order(diagnostics: Sequence[Diagnostic]) -> list[Rule]:
    seen: dict[str, Rule] = {}
    for diagnostic in diagnostics:
        seen.setdefault(diagnostic.rule.id, diagnostic.rule)
    return list(seen.values())
