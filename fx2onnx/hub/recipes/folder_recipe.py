"""`FolderRecipe`: what every export-hf folder kind does, one recipe module each (the table
from task and runtime to recipe is fx2onnx/hub/recipe_table.py).

A recipe says whether it writes a request for a loaded model (`accepts`: a `Refusal`, or
None), writes its models and configuration files into the staging folder (`export`), and
runs the written folder as its runtime will against transformers (`verify`). `export_hf`
does the rest for every kind alike: the request, the staging folder and its atomic move,
the source's files, the tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

import fx2onnx
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.request import ExportRequest, Refusal
from fx2onnx.hub.shared.genai_config import GENAI_CONFIG
from fx2onnx.hub.shared.generation_search import generation_notes
from fx2onnx.hub.shared.verification import Tolerance, Verification

Say = Callable[[str], None]


class FolderRecipe(Protocol):
    """One folder kind of export-hf.

    Attributes:
        special_tokens: whether the folder's tokenizer adds its special tokens (a Whisper
            prompt carries its own, its runtime's tokenizer adds none).
    """

    special_tokens: bool

    def accepts(self, loaded: LoadedModel, request: ExportRequest) -> Refusal | None:
        """Why this kind cannot write ``request`` for ``loaded`` (its declared options), or None."""

    def export(
        self, loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, request: ExportRequest, say: Say,
    ) -> list[str]:
        """Write the folder's models and configuration files into ``staging``; their relative paths."""

    def verify(
        self, loaded: LoadedModel, folder: Path, model: torch.nn.Module, request: ExportRequest, tolerance: Tolerance,
        say: Say,
    ) -> Verification:
        """Run ``folder`` as its runtime will and compare with ``model`` (real weights)."""

    def client_note(self, config: dict[str, Any], genai_config: bool) -> str | None:
        """What to tell of the clients that cannot load the folder, whose config.json is ``config``
        (``genai_config``: the folder has a `genai_config.json`)."""

    def generation_notes(self, folder: Path) -> list[str]:
        """What the folder's clients run unlike transformers' `generate` with its generation config."""


class RecipeDefaults:
    """What most recipes share: a tokenizer with its special tokens, no note on clients, a
    folder Transformers.js loads (``transformers_js``) and ONNX Runtime GenAI too where it
    has a `genai_config.json`, whose search differences from transformers' `generate` with
    the folder's generation config are said (shared/generation_search.py)."""

    special_tokens = True
    transformers_js = True
    takes_vocoder = False  # a separate vocoder checkpoint (`vocoder`): SpeechT5's text-to-audio

    def client_note(self, config: dict[str, Any], genai_config: bool) -> str | None:
        return None

    def generation_notes(self, folder: Path) -> list[str]:
        return generation_notes(folder, (folder / GENAI_CONFIG).is_file(), self.transformers_js)
