"""The README and the documentation site (`docs/**/*.md`) hold: every Python block pastes
and runs, the set-up commands are the ones CI runs, and the command-line examples parse.

Every fenced block names its language: ```python blocks run (each alone, in an empty
folder); ```bash blocks are shell commands (CI runs the set-up ones, the `fx2onnx ...`
lines are parsed); text, json, yaml and toml blocks are shown as they are. A Python block
that must not run here (it downloads from the hub, or needs a 7B model) has, on the line
right before its fence, the marker

    <!-- docs-test: not run, <why> -->

with the reason; keep those few. A block that needs torchvision has the marker

    <!-- docs-test: vision -->

and runs with the vision tests (`pytest -m vision`, in the environment that has torchvision;
elsewhere it is skipped). A block that appears in several pages runs once."""

from __future__ import annotations

import re
import runpy
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from conftest import ATOL, RTOL
from fx2onnx.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LANGUAGES = {"python", "bash", "text", "json", "yaml", "toml", "javascript"}
NOT_RUN = re.compile(r"^<!-- docs-test: not run, (?P<why>\S.*\S) -->$")
VISION = "<!-- docs-test: vision -->"
FENCE = re.compile(r"^```(?P<language>[^\n`]*)\n(?P<code>.*?)^```$", flags=re.S | re.M)


@dataclass(frozen=True)
class Block:
    where: str  # path:line of the fence
    language: str
    code: str
    not_run_because: str | None
    vision: bool = False


def _blocks_of(path: Path, root: Path = ROOT) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    blocks = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NOT_RUN.match(before.strip())
        where = f"{path.relative_to(root).as_posix()}:{line}"
        why = marker["why"] if marker else None
        blocks.append(Block(where, match["language"].strip(), match["code"], why, before.strip() == VISION))
    return blocks


BLOCKS = [block for page in PAGES for block in _blocks_of(page)]


def _unique_python_blocks() -> dict[str, list[Block]]:
    """Each Python block to run, once, with every place it appears."""
    found: dict[str, list[Block]] = {}
    for block in BLOCKS:
        if block.language == "python" and block.not_run_because is None:
            found.setdefault(block.code, []).append(block)
    return found


PYTHON_BLOCKS = _unique_python_blocks()


def _snippet_params() -> list:
    params = []
    for code, places in PYTHON_BLOCKS.items():
        vision = any(block.vision for block in places)
        params.append(pytest.param(code, vision, id=places[0].where, marks=[pytest.mark.vision] if vision else []))
    return params


def _blocks(language: str) -> list[str]:
    return [block.code for block in BLOCKS if block.language == language]


def test_the_readme_and_the_docs_have_python_snippets():
    assert sum(1 for b in BLOCKS if b.where.startswith("README.md") and b.language == "python") >= 3
    assert len(PYTHON_BLOCKS) >= 10


def test_every_block_names_its_language():
    wrong = [f"{b.where}: {b.language!r}" for b in BLOCKS if b.language not in LANGUAGES]
    assert not wrong, f"fenced blocks need one of {sorted(LANGUAGES)} after the fence: {wrong}"


def test_blocks_not_run_are_few_and_python():
    not_run = [b for b in BLOCKS if b.not_run_because is not None]
    assert all(b.language == "python" for b in not_run), [b.where for b in not_run if b.language != "python"]
    assert len(not_run) <= 3, f"keep the blocks that do not run few: {[b.where for b in not_run]}"


def test_the_not_run_marker_is_read(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n<!-- docs-test: not run, downloads a 7B model -->\n```python\nimport big\n```\n\n"
        "```python\nprint(1)\n```\n",
        encoding="utf-8",
    )
    marked, plain = _blocks_of(page, root=tmp_path)
    assert (marked.not_run_because, marked.code, marked.where) == ("downloads a 7B model", "import big\n", "page.md:4")
    assert (plain.not_run_because, plain.code) == (None, "print(1)\n")
    page.write_text("<!-- docs-test: vision -->\n```python\nimport torchvision\n```\n", encoding="utf-8")
    (vision,) = _blocks_of(page, root=tmp_path)
    assert vision.vision and vision.not_run_because is None


@pytest.mark.parametrize(("code", "vision"), _snippet_params())
def test_python_snippet_runs_as_pasted(tmp_path, monkeypatch, code, vision):
    if vision:
        pytest.importorskip("torchvision", reason="torchvision cannot be imported in this environment (install fx2onnx[vision])", exc_type=ImportError)
    # Each snippet alone, in an empty folder, as a file (ONNX Script reads its source).
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    namespace = runpy.run_path(str(script), run_name="__main__")
    if "program" in namespace and namespace["program"].model_proto is not None:  # it exported a real model
        import onnx

        onnx.checker.check_model(namespace["program"].model_proto, full_check=True)
    for marker, compare in _NUMBERS.items():
        if marker in code:
            compare(namespace)


# The snippets that compute numbers, each compared with PyTorch (found by a line of its own).
def _first_snippet(ns: dict) -> None:
    torch.testing.assert_close(ns["outputs"], ns["model"](ns["x"]).detach(), rtol=RTOL, atol=ATOL)


def _decode_step(ns: dict) -> None:
    with torch.no_grad():  # the eager call appends to the cache it is given: a new one of the same prompt
        past = ns["model"](input_ids=ns["prompt"]).cache
        expected = ns["model"](input_ids=ns["ids"], attention_mask=ns["mask"], cache=past).logits
    torch.testing.assert_close(ns["out"].logits, expected, rtol=RTOL, atol=ATOL)


def _fake_mode_with_weights(ns: dict) -> None:
    with torch.no_grad():
        torch.testing.assert_close(ns["outputs"], ns["real"](torch.ones(2, 16)), rtol=RTOL, atol=ATOL)
    import onnxruntime as ort  # the saved file holds the checkpoint's weights

    session = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
    (saved,) = session.run(None, {session.get_inputs()[0].name: torch.ones(2, 16).numpy()})
    torch.testing.assert_close(torch.from_numpy(saved), ns["outputs"], rtol=RTOL, atol=ATOL)


def _fake_mode_checkpoint_folder(ns: dict) -> None:
    import onnxruntime as ort
    import transformers

    session = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
    ids = torch.zeros(1, 8, dtype=torch.int64)  # the snippet's ids, which are fake
    logits = session.run(["logits"], {session.get_inputs()[0].name: ids.numpy()})[0]
    with torch.no_grad():
        expected = transformers.AutoModelForCausalLM.from_pretrained("checkpoint").eval()(ids).logits
    torch.testing.assert_close(torch.from_numpy(logits), expected, rtol=RTOL, atol=ATOL)


_NUMBERS = {
    "outputs = program(x)": _first_snippet,
    "out = decode(": _decode_step,
    'torch.save(real.state_dict(), "weights.pt")': _fake_mode_with_weights,
    'program.save("model.onnx", model_state="checkpoint"': _fake_mode_checkpoint_folder,
}


def test_every_snippet_that_computes_numbers_is_compared():
    assert all(any(marker in code for code in PYTHON_BLOCKS) for marker in _NUMBERS), "a marker no snippet holds"


def _setup_commands(text: str) -> list[str]:
    setup = text.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"^```bash\n(.*?)^```", setup, flags=re.S | re.M)]


def test_setup_commands_are_the_ones_ci_runs():
    commands = _setup_commands(README)
    assert len(commands) == 2, "exactly two set-up commands: install and run the demo; run the tests"
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    for command in commands:
        assert "\n" not in command and command in ci_lines, command
    assert commands[0].startswith("pip install torch==2.13.0 ") and commands[0].endswith("python -m fx2onnx demo")
    getting_started = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert _setup_commands(getting_started) == commands, "docs/getting-started.md gives the README's set-up commands"


def test_the_docs_build_command_is_the_one_ci_runs():
    (command,) = [line.strip() for code in _blocks("bash") for line in code.splitlines() if "mkdocs build" in line][:1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "mkdocs build --strict" in command and "mkdocs build --strict" in ci
    assert '".[docs]"' in command and '".[docs]"' in ci


def test_command_line_examples_parse():
    examples = [
        line.strip() for code in _blocks("bash") for line in code.splitlines() if line.strip().startswith("fx2onnx ")
    ]
    assert any(" export " in line for line in examples)
    parser = build_parser()
    for line in examples:
        args = parser.parse_args(shlex.split(line, comments=True)[1:])  # a trailing comment is bash's, not an argument
        if args.command == "export":
            assert ":" in args.model
