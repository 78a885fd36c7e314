"""An `export-hf` folder of a tiny decoder written with `--verify`, and its greedy tokens and
logits after one prompt compared with transformers': the check of the tests whose models
change computation at a prompt length (a scan's chunks)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import onnx
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.decoders.verify_lengths import greedy_in_transformers
from fx2onnx.hub.shared.verification import greedy_in_folder


def verified_folder(source: Path, out: Path, new_tokens: int) -> tuple[Any, list[str]]:
    """The result of `export_hf(source, out, verify=True)` and the lines it said."""
    said: list[str] = []
    result = export_hf(source, out, task="text-generation", verify=True, tokens=new_tokens, say=said.append)
    return result, said


def assert_greedy_equal(model: torch.nn.Module, folder: Path, length: int, new_tokens: int, ids: dict[str, int]) -> None:
    """A random prompt of ``length`` tokens: the folder's greedy tokens equal transformers', and
    its logits (the prompt's, then each decode step's) within float rounding."""
    prompt = torch.randint(3, ids["vocab_size"], (length,), generator=torch.Generator().manual_seed(length)).tolist()
    ours = greedy_in_folder(folder / "onnx" / "model.onnx", [prompt], new_tokens, pad=0, banned=[ids["eos_token_id"]])
    theirs = greedy_in_transformers(model, [prompt], new_tokens, pad=0)
    assert ours.tokens == theirs.tokens
    for a, b in zip(ours.logits, theirs.logits):
        torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), rtol=1e-4, atol=1e-5)


def assert_verified_past(result: Any, said: list[str], folder: Path, reached: str) -> None:
    """--verify passed, its lengths line says ``reached``, and the folder's model is valid ONNX."""
    assert result.verification.passed and result.verification.tokens_equal, result.verification.summary()
    lengths = next(line for line in said if line.startswith("verification lengths:"))
    assert reached in lengths, lengths
    onnx.checker.check_model(os.fspath(folder / "onnx" / "model.onnx"), full_check=True)
