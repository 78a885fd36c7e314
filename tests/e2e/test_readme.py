"""The README holds: every Python snippet pastes and runs, its set-up commands are the ones
CI runs, and its command-line examples parse."""

from __future__ import annotations

import re
import runpy
import shlex
from pathlib import Path

import pytest
import torch

from conftest import ATOL, RTOL
from fx2onnx.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, flags=re.S | re.M)


PYTHON_BLOCKS = _blocks("python")


def test_the_readme_has_python_snippets():
    assert len(PYTHON_BLOCKS) >= 5


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_python_snippet_runs_as_pasted(tmp_path, monkeypatch, index):
    # Each snippet alone, in an empty folder, as a file (ONNX Script reads its source).
    monkeypatch.chdir(tmp_path)
    script = tmp_path / f"snippet_{index}.py"
    script.write_text(PYTHON_BLOCKS[index], encoding="utf-8")
    namespace = runpy.run_path(str(script), run_name="__main__")
    if "program" in namespace:  # the snippet exported something: it is a real model
        import onnx

        onnx.checker.check_model(namespace["program"].model_proto, full_check=True)
    for marker, compare in _NUMBERS.items():
        if marker in PYTHON_BLOCKS[index]:
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
    assert all(any(marker in block for block in PYTHON_BLOCKS) for marker in _NUMBERS), "a marker no snippet holds"


def test_setup_commands_are_the_ones_ci_runs():
    setup = README.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    commands = [block.strip() for block in re.findall(r"^```bash\n(.*?)^```", setup, flags=re.S | re.M)]
    assert len(commands) == 2, "exactly two set-up commands: install and run the demo; run the tests"
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    for command in commands:
        assert "\n" not in command and command in ci_lines, command
    assert commands[0].startswith("pip install torch==2.13.0 ") and commands[0].endswith("python -m fx2onnx demo")


def test_command_line_examples_parse():
    examples = [
        line.strip() for block in _blocks("bash") for line in block.splitlines() if line.strip().startswith("fx2onnx ")
    ]
    assert any(" export " in line for line in examples)
    parser = build_parser()
    for line in examples:
        args = parser.parse_args(shlex.split(line)[1:])
        if args.command == "export":
            assert ":" in args.model
