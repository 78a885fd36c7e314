"""Phi-4-multimodal as ONNX Runtime GenAI's `phi4mm` type runs it: the vision, speech,
embedding and decoder models cut from the model's own modules
(vision_language/phi4_multimodal.py, phi4_speech.py), `genai_config.json` and the
runtime's image and audio processor configurations. With `without_audio` the speech model
is left out (no `speech` section: the runtime then refuses audio inputs with its own
message), and export-hf says so."""

from __future__ import annotations

from pathlib import Path

import torch

import fx2onnx
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.precision.folder_precision import FLOAT_ONLY, precision_refusal
from fx2onnx.hub.recipes.folder_recipe import RecipeDefaults, Say
from fx2onnx.hub.request import ExportRequest, Refusal
from fx2onnx.hub.shared.dim_roles import name_dims_by_role
from fx2onnx.hub.shared.json_files import write_json_file
from fx2onnx.hub.shared.program_files import onnx_file, save_program
from fx2onnx.hub.shared.renamed_weights import part_checkpoint
from fx2onnx.hub.shared.verification import Tolerance, Verification
from fx2onnx.hub.vision_language import genai_files, phi4_multimodal, phi4_speech
from fx2onnx.hub.vision_language.phi4_multimodal_verify import verify_phi4mm
from fx2onnx.onnx_passes import source_weight_names

AUDIO_NOTE = (
    "phi4mm folder for images and text: the speech model is left out (--without-audio), so ONNX Runtime GenAI refuses "
    "audio inputs for this folder"
)


class Phi4MMRecipe(RecipeDefaults):
    """The `phi4mm` folder for ONNX Runtime GenAI."""

    transformers_js = False

    def accepts(self, loaded: LoadedModel, request: ExportRequest) -> Refusal | None:
        if request.runtime != "onnxruntime":
            return Refusal(NotImplementedError, (
                f"export-hf writes Phi-4-multimodal only for ONNX Runtime GenAI (its phi4mm type); --runtime "
                f"{request.runtime} has no layout for it here. Nothing was written. `fx2onnx export-hf <model> --output "
                "<folder>` writes the GenAI folder; `--text-only` writes its language model alone."
            ))
        try:
            phi4_multimodal.check(loaded.config)
        except NotImplementedError as error:
            return Refusal(NotImplementedError, f"{error} `--text-only` exports its language model alone.")
        if not request.without_audio:
            wrong = phi4_speech.check(loaded.config, phi4_speech.feature_extractor_settings(Path(loaded.folder)))
            if wrong:
                return Refusal(NotImplementedError, (
                    f"ONNX Runtime GenAI's phi4mm audio processor cannot feed this Phi-4-multimodal: {'; '.join(wrong)}. "
                    "Nothing was written. --without-audio writes the folder for images and text (without_audio=True); "
                    "--text-only its language model alone."
                ))
        return precision_refusal(loaded, request, FLOAT_ONLY)

    def export(
        self, loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, request: ExportRequest, say: Say,
    ) -> list[str]:
        processors = {phi4_multimodal.VISION_PROCESSOR_CONFIG: phi4_multimodal.vision_processor_config(
            phi4_multimodal.image_processor_settings(Path(loaded.folder)))}
        if not request.without_audio:
            processors[phi4_speech.SPEECH_PROCESSOR_CONFIG] = phi4_speech.speech_processor_config(
                phi4_speech.feature_extractor_settings(Path(loaded.folder)))
        programs = phi4_multimodal.export_parts(loaded, options, speech=not request.without_audio)
        if request.without_audio:
            say(AUDIO_NOTE)
        files, paths = [], {}
        state = part_checkpoint(loaded.folder, loaded.model, loaded.model) if loaded.fake_context is not None else None
        for part, base in part_files(request).items():
            if part not in ("vision", "speech"):  # their dims are the images' and clips', no role the runtime names
                name_dims_by_role(programs[part].model)
            paths[part] = onnx_file(loaded, base)
            needed = source_weight_names(programs[part].model)  # packed or quantized weights: their sources
            files += save_program(programs[part], staging, paths[part], loaded, state.only(needed) if state is not None else None)
        generation = getattr(loaded.model, "generation_config", None)
        config = phi4_multimodal.phi4mm_genai_config(loaded.config, generation, paths, programs["decoder"].model)
        for name, content in (("genai_config.json", config), *processors.items()):
            files.append(write_json_file(staging, name, content))
        return files

    def verify(
        self, loaded: LoadedModel, folder: Path, model: torch.nn.Module, request: ExportRequest, tolerance: Tolerance,
        say: Say,
    ) -> Verification:
        files = {part: folder / onnx_file(loaded, base) for part, base in part_files(request).items()}
        return verify_phi4mm(files, model, request.tokens, tolerance)


def part_files(request: ExportRequest) -> dict[str, str]:
    """The folder's models by part: the speech model unless `without_audio`."""
    return genai_files.PARTS if request.without_audio else {**genai_files.PARTS, "speech": phi4_speech.SPEECH}


RECIPE = Phi4MMRecipe()
