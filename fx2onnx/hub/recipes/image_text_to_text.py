"""The image-text-to-text recipes: ONNX Runtime GenAI's vision, embedding and decoder
models, its genai_config.json and image processor configuration (vision_language/); and
with runtime "standard" the folder Transformers.js loads, the same vision model and decoder
beside the token embedding alone (vision_language/transformers_js.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import fx2onnx
from fx2onnx.hub.decoders.state_names import write_transformers_js_states
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.precision.folder_precision import FLOAT_ONLY, precision_refusal
from fx2onnx.hub.recipes.folder_recipe import RecipeDefaults, Say
from fx2onnx.hub.request import ExportRequest, Refusal
from fx2onnx.hub.shared.dim_roles import name_dims_by_role
from fx2onnx.hub.shared.json_files import write_json_file
from fx2onnx.hub.shared.program_files import onnx_file, save_program
from fx2onnx.hub.shared.renamed_weights import part_checkpoint
from fx2onnx.hub.shared.verification import Tolerance, Verification
from fx2onnx.hub.vision_language import genai_files
from fx2onnx.hub.vision_language.architecture import VisionLanguageArchitecture
from fx2onnx.hub.vision_language.architectures import architecture_of
from fx2onnx.hub.vision_language.folder_verification import verify_image_text_to_text
from fx2onnx.hub.vision_language.transformers_js import (
    transformers_js_architecture, transformers_js_hint, transformers_js_note, transformers_js_refusal, write_processor_class,
)
from fx2onnx.onnx_passes import source_weight_names


def architecture_for(config: Any, for_transformers_js: bool) -> VisionLanguageArchitecture:
    """The architecture of the folder: Transformers.js's (its own rows included) or ONNX Runtime GenAI's."""
    return transformers_js_architecture(config) if for_transformers_js else architecture_of(config)


def image_processor_of(loaded: LoadedModel, architecture: VisionLanguageArchitecture) -> Any:
    """The checkpoint's image processor, or None where the architecture reads none."""
    if not architecture.reads_image_processor:
        return None
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(loaded.folder)


def export_folder(
    loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, say: Callable[[str], None] = lambda line: None,
    for_transformers_js: bool = False,
) -> list[str]:
    """Write the three models and the two configuration files into ``staging``; returns their
    paths. ``for_transformers_js``: the three models only, the embedding without the images."""
    architecture = architecture_for(loaded.config, for_transformers_js)
    image_processor = image_processor_of(loaded, architecture)
    if for_transformers_js:  # Transformers.js merges the image features itself: the token embedding alone
        architecture = dataclasses.replace(architecture, merges_images=False)
    programs = architecture.export(loaded, options, image_processor)
    if for_transformers_js:
        say(transformers_js_note(loaded.config))
    else:
        say(architecture.image_sizes_note(image_processor))
    files, paths = [], {}
    # the parts are modules of the model, not the model: their weights by the model's names
    # (every name of a tied weight reads the one the checkpoint holds: a tied LM head is `lm_head.weight` in the decoder)
    state = None
    if loaded.fake_context is not None:
        state = part_checkpoint(loaded.folder, loaded.model, loaded.model)
    # the parts the architecture has: the three of every folder, and an optional one (Gemma 4's and Gemma 3n's audio model)
    for part, base in (genai_files.PARTS | genai_files.OPTIONAL_PARTS).items():
        if part not in programs:
            continue
        if part not in ("vision", "audio"):  # their dims are the image's and the clip's, no role the runtime names
            name_dims_by_role(programs[part].model)
        paths[part] = onnx_file(loaded, base)
        needed = source_weight_names(programs[part].model)  # packed or quantized weights: their sources
        files += save_program(programs[part], staging, paths[part], loaded, state.only(needed) if state is not None else None)
    if for_transformers_js:  # its config.json and tokenizer: the source's
        # a hybrid text model's states under the names Transformers.js feeds (its text config's model type)
        write_transformers_js_states(staging, paths["decoder"], loaded.config.text_config.to_dict())
        return files + write_processor_class(Path(loaded.folder), staging, loaded.config)
    generation = getattr(loaded.model, "generation_config", None)
    config = genai_files.genai_vlm_config(loaded.config, generation, paths, programs["decoder"].model, architecture)
    processor = architecture.processor_config(image_processor, loaded.config)
    for name, content in (("genai_config.json", config), (genai_files.PROCESSOR_CONFIG, processor)):
        files.append(write_json_file(staging, name, content))
    return files


def verify_folder(
    loaded: LoadedModel, folder: Path, model: torch.nn.Module, tokens: int, tolerance: Tolerance,
    for_transformers_js: bool = False,
) -> Verification:
    """The folder's greedy generation on an image against ``model``'s (vision_language/folder_verification.py)."""
    architecture = architecture_for(loaded.config, for_transformers_js)
    image_processor = image_processor_of(loaded, architecture)
    files = {part: folder / onnx_file(loaded, base) for part, base in genai_files.PARTS.items()}
    files |= {part: folder / onnx_file(loaded, base) for part, base in genai_files.OPTIONAL_PARTS.items()
              if (folder / onnx_file(loaded, base)).is_file()}
    return verify_image_text_to_text(files, model, image_processor, tokens, tolerance, architecture,
                                     embedding_merges=not for_transformers_js)


class ImageTextToTextRecipe(RecipeDefaults):
    """The folder for ONNX Runtime GenAI, or (``for_transformers_js``) for Transformers.js."""

    def __init__(self, for_transformers_js: bool = False) -> None:
        # RecipeDefaults' flag, read by its generation notes too: the GenAI folder's embedding merges the images,
        # so it is for the runtime alone
        self.transformers_js = for_transformers_js

    def accepts(self, loaded: LoadedModel, request: ExportRequest) -> Refusal | None:
        if self.transformers_js and (refusal := transformers_js_refusal(loaded.config)) is not None:
            return refusal
        try:
            architecture_for(loaded.config, self.transformers_js)
        except NotImplementedError as error:  # an architecture without a runtime layout here
            hint = "" if self.transformers_js else transformers_js_hint(loaded.config)
            return Refusal(type(error), f"{error}{hint}")  # its class: an architecture without a row is refused as such
        return precision_refusal(loaded, request, FLOAT_ONLY)

    def export(
        self, loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, request: ExportRequest, say: Say,
    ) -> list[str]:
        return export_folder(loaded, staging, options, say, self.transformers_js)

    def verify(
        self, loaded: LoadedModel, folder: Path, model: torch.nn.Module, request: ExportRequest, tolerance: Tolerance,
        say: Say,
    ) -> Verification:
        return verify_folder(loaded, folder, model, request.tokens, tolerance, self.transformers_js)


RECIPE = ImageTextToTextRecipe()
TRANSFORMERS_JS_RECIPE = ImageTextToTextRecipe(for_transformers_js=True)
