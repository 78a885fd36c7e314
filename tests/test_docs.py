"""The documentation site (mkdocs.yml, docs/) and the README stay complete: every public
name has its API entry, every option its description, every page is in the menu, and the
README's links land on files that exist. (CI's `mkdocs build --strict` checks the links
between pages, their anchors and that mkdocstrings finds every name; this runs with the
tests, without the docs extra.)"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import fx2onnx
from diagnostics import rules
from fx2onnx.hub.decoders.client_support import TRANSFORMERS_JS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_api_page_has_every_public_name():
    page = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    listed = re.findall(r"^::: fx2onnx\.(\w+)$", page, flags=re.M)
    assert sorted(listed) == sorted(fx2onnx.__all__), "docs/reference/api.md lists `::: fx2onnx.NAME` for each name of __all__"


@pytest.mark.parametrize("name", [n for n in fx2onnx.__all__ if n != "__version__"])
def test_every_public_name_has_a_docstring_of_its_own(name):
    # a dataclass without one gets its field list as __doc__: no help on the API page
    doc = getattr(fx2onnx, name).__doc__ or ""
    assert doc.strip() and not doc.startswith(f"{name}("), f"fx2onnx.{name} needs a docstring"


@pytest.mark.parametrize("options", [fx2onnx.ExportOptions, fx2onnx.ModuleFunctionOptions])
def test_every_option_field_is_described_in_its_docstring(options):
    # The reference page is the docstring's Attributes section, field by field.
    attributes = options.__doc__.split("Attributes:", 1)[1]
    described = set(re.findall(r"^\s{8}(\w+):", attributes, flags=re.M))
    missing = [f.name for f in dataclasses.fields(options) if f.name not in described]
    assert not missing, f"{options.__name__}'s docstring does not describe {missing} under Attributes"


def test_diagnostic_options_fields_are_described():
    doc = fx2onnx.DiagnosticOptions.__doc__
    assert all(f"``{f.name}``" in doc for f in dataclasses.fields(fx2onnx.DiagnosticOptions))


def test_the_rules_page_has_a_section_per_rule():
    page = (DOCS / "rules.md").read_text(encoding="utf-8")
    assert [f"## {r.id} {r.name}" for r in rules.ALL] == re.findall(r"^## FXE\d+ .*$", page, flags=re.M)


def test_every_page_is_in_the_menu_and_every_menu_entry_is_a_page():
    in_nav = set(re.findall(r":\s*(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(encoding="utf-8"), flags=re.M))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert in_nav == pages, f"not in mkdocs.yml's nav: {sorted(pages - in_nav)}; no such page: {sorted(in_nav - pages)}"


def test_readme_links_land_on_files_and_headings_that_exist():
    for target in re.findall(r"\]\(([^)\s]+)\)", README):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        text = (ROOT / path).read_text(encoding="utf-8") if path else README
        if anchor:
            slugs = {re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-") for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}
            assert anchor in slugs, f"README links to {target}: no such heading"


def test_every_command_line_option_is_in_the_reference():
    import argparse

    from fx2onnx.cli.main import build_parser

    page = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    missing = [
        f"{name} {option}"
        for name, parser in commands.choices.items()
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help" and f"`{option}" not in page and f"/{option}`" not in page
    ]
    assert not missing, f"docs/reference/cli.md does not describe {missing} (write them as `--option`)"


def test_the_readme_stays_short():
    assert len(README.splitlines()) <= 210, "the README gets you started; the rest goes to docs/"


def test_the_docs_name_the_transformers_js_release_the_messages_name():
    # where a page says which Transformers.js the folders are tested in, it is the release export-hf's messages
    # name (and the tests pin); scoreboard.md is generated from results that record the release each pair ran in
    pages = [p for p in DOCS.rglob("*.md") if p.name != "scoreboard.md"]
    named = {f"{p.relative_to(DOCS)}: {m.group(0)}"
             for p in pages for m in re.finditer(r"Transformers\.js \d+\.\d+\.\d+", p.read_text(encoding="utf-8"))
             if m.group(0) != TRANSFORMERS_JS}
    assert not named, f"the docs name another release than {TRANSFORMERS_JS}: {sorted(named)}"
