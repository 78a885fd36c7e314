"""What export-hf knows of one image-text-to-text architecture, as one value: the row an
architecture module gives the table of `architectures.py`.

An architecture module (named after its model type, e.g. gemma3.py) holds what
differs between architectures: its vision model and how the parts are exported, its
`genai_config.json` vision section and `genai_processor_config.json`, what export-hf says
of the image sizes it takes, and its verification's images, prompt and vision loop. What
they share is in parts.py (the embedding and decoder wrappers), genai_files.py (the
folder's files) and folder_verification.py (the greedy loop over the three models).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch


class WideRows(Protocol):
    """Features that ride beside the embeddings in wider `image_features` and
    `inputs_embeds` rows (Qwen3-VL's DeepStack: qwen3_vl.py), and how the decoder reads them."""

    def extra_width(self, config: Any) -> int:
        """The columns after the embedding's."""

    def split(self, language_model: torch.nn.Module, inputs_embeds: torch.Tensor, hidden: int) -> tuple[torch.Tensor, dict[str, Any]]:
        """The embeddings of wide rows and the language model's arguments for the rest."""

    def restore(self, language_model: torch.nn.Module) -> None:
        """Undo what ``split`` changed on the language model."""


@dataclass
class Prompt:
    """A verification prompt with its images as both sides take them."""

    ids: torch.Tensor
    generate_inputs: dict[str, torch.Tensor]  # model.generate's image inputs beside input_ids
    features: torch.Tensor  # transformers' image features, shaped as the vision model gives them
    positions: np.ndarray  # the prompt's position_ids
    next_position: Callable[[int], np.ndarray]  # position_ids of the token at an index after the prompt


def prompt_text(config: Any, special: set[int]) -> list[int]:
    """A verification prompt's text tokens: random, none of the ``special`` ones."""
    vocab = int(config.text_config.vocab_size)
    return [t for t in torch.randint(0, vocab, (12,), generator=torch.Generator().manual_seed(1)).tolist() if t not in special]


def _no_check(config: Any) -> None:
    return None


@dataclass(frozen=True)
class VisionLanguageArchitecture:
    """One image-text-to-text architecture as ONNX Runtime GenAI runs it.

    Attributes:
        genai_type: the runtime's model type (`model.type` of genai_config.json).
        export_parts: (loaded model, export options, image processor, this
            architecture) -> the "vision", "embedding" and "decoder" programs.
        vision_section: (config, vision file, processor configuration file) ->
            genai_config.json's `model.vision`.
        processor_config: (image processor, config) -> genai_processor_config.json.
        image_sizes_note: (image processor) -> what export-hf says of the images the
            vision model takes.
        verification_sizes: (model, image processor) -> the (height, width) of the
            verification's random images.
        verification_prompt: (model, the image processor's outputs) -> the prompt.
        image_features: (vision session, the image processor's outputs) -> the features
            of every image, the vision model run as the runtime runs it.
        mrope: the decoder takes 3-D mRoPE `position_ids` (3, batch, tokens), else 1-D.
        wide_rows: features riding beside the embeddings (None: rows of the hidden size).
        check: raises a clear error for a configuration the runtime cannot run.
        merges_images: the embedding takes the image features (ONNX Runtime GenAI's), else
            it is the token embedding alone (Transformers.js merges the features itself).
        more_pairs: (the folder's files by part, model) -> more (onnxruntime, transformers)
            results the verification judges: a model of the folder the greedy loop does not
            run (Gemma 4's audio model); None: no other.
        verification_images: (model, image processor) -> the vision inputs of the
            verification, where they are not the image processor's on random images of
            ``verification_sizes`` (None: they are).
        reads_image_processor: the export and verification read the checkpoint's image
            processor (False: they are given None; LFM2-VL's needs torchvision).
    """

    genai_type: str
    export_parts: Callable[..., dict[str, Any]]
    vision_section: Callable[[Any, str, str], dict[str, Any]]
    processor_config: Callable[[Any, Any], dict[str, Any]]
    image_sizes_note: Callable[[Any], str]
    verification_sizes: Callable[[torch.nn.Module, Any], tuple[tuple[int, int], ...]]
    verification_prompt: Callable[[torch.nn.Module, dict[str, torch.Tensor]], Prompt]
    image_features: Callable[[Any, dict[str, torch.Tensor]], np.ndarray]
    mrope: bool = True
    wide_rows: WideRows | None = None
    check: Callable[[Any], None] = _no_check
    merges_images: bool = True
    more_pairs: Callable[[dict[str, Any], torch.nn.Module], list[tuple[np.ndarray, torch.Tensor]]] | None = None
    verification_images: Callable[[torch.nn.Module, Any], dict[str, torch.Tensor]] | None = None
    reads_image_processor: bool = True

    def export(self, loaded: Any, options: Any, image_processor: Any) -> dict[str, Any]:
        """The "vision", "embedding" and "decoder" programs of ``loaded``'s model."""
        return self.export_parts(loaded, options, image_processor, self)

    def row_width(self, config: Any) -> int:
        """The width of `image_features` and `inputs_embeds` rows: the text hidden size,
        and the wide rows' extra columns."""
        extra = self.wide_rows.extra_width(config) if self.wide_rows is not None else 0
        return int(config.text_config.hidden_size) + extra


def transformers_js_only(model_types: str, **fields: Any) -> VisionLanguageArchitecture:
    """The row of an architecture ONNX Runtime GenAI has no type for (Transformers.js's
    table holds it: transformers_js.py): its runtime configuration refused, saying so."""

    def no_genai_folder(*args: Any) -> Any:
        raise NotImplementedError(
            f"ONNX Runtime GenAI 0.18 has no {model_types} model type: only Transformers.js's folder is written."
        )

    return VisionLanguageArchitecture(genai_type="", vision_section=no_genai_folder, processor_config=no_genai_folder,
                                      image_sizes_note=no_genai_folder, **fields)
