"""The image-text-to-text recipe of an encoder-decoder (Florence-2) for Transformers.js
(`--runtime standard`): its ImageTextToText kind loads `encoder_model` beside the vision
encoder, token embedding and merged decoder where the config says `is_encoder_decoder`
(session_config.js's sessions); the four models are vision_language/florence2.py's, verified
as Transformers.js runs them (florence2_verify.py). The processor files name Florence2Processor
with the task prompts transformers' processor expands, which Transformers.js's reads from
`preprocessor_config.json`. ONNX Runtime GenAI has no encoder-decoder vision-language type:
with runtime "onnxruntime" image_text_to_text.py's recipe refuses the model (no architecture row)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import fx2onnx
from fx2onnx.hub.decoders.client_support import TRANSFORMERS_JS
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.precision.folder_precision import FLOAT_ONLY, precision_refusal
from fx2onnx.hub.recipes.folder_recipe import RecipeDefaults, Say
from fx2onnx.hub.request import ExportRequest, Refusal
from fx2onnx.hub.shared.json_files import write_json_file
from fx2onnx.hub.shared.program_files import onnx_file, weights_dtype
from fx2onnx.hub.shared.verification import Tolerance, Verification
from fx2onnx.hub.vision_language import florence2
from fx2onnx.hub.vision_language.florence2_verify import verify_florence2
from fx2onnx.hub.vision_language.transformers_js import (
    IMAGE_PROCESSOR_FILE, PROCESSOR_FILE, TRANSFORMERS_JS_ARCHITECTURES, image_processor_settings, transformers_js_note,
    transformers_js_refusal,
)

# why the folder is not written in a dtype
DTYPE_CAUSES = {
    torch.float16: (
        "in float16 BART's encoder layers branch on their values (`if hidden_states.dtype == torch.float16 and not "
        "torch.isfinite(hidden_states).all()`, transformers/models/bart/modeling_bart.py), which torch.export cannot "
        "capture (BART's own text2text-generation export fails there too)"
    ),
    torch.bfloat16: f"{TRANSFORMERS_JS} has no bfloat16 dtype to load (DATA_TYPES: fp32, fp16 and quantized ones)",
}
# the processor's tables Transformers.js's Florence2Processor reads from the image processor's settings
TASK_TABLES = ("tasks_answer_post_processing_type", "task_prompts_without_inputs", "task_prompts_with_input")


def required_image_processor_settings(source: Path) -> dict[str, Any]:
    """The source's image processor settings (transformers_js.image_processor_settings), which
    the folder cannot do without."""
    settings = image_processor_settings(source)
    if settings is None:
        raise FileNotFoundError(f"{source} has no image processor settings ({IMAGE_PROCESSOR_FILE}, or {PROCESSOR_FILE} with "
                                "an `image_processor` part): the folder's clients cannot make pixel_values without them.")
    return settings


def write_processor_files(source: Path, staging: Path, config: Any) -> list[str]:
    """`preprocessor_config.json` as Transformers.js's AutoProcessor reads it for ``config``'s
    model type: the image processor's settings, the processor class of its row
    (Florence2Processor), and the task tables of transformers' processor (its task prompts and
    their answers' post-processing), which Transformers.js's reads from there."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(source)
    processor_class = TRANSFORMERS_JS_ARCHITECTURES[config.model_type].processor_class
    settings = {**required_image_processor_settings(source), "processor_class": processor_class}
    for name in TASK_TABLES:
        settings.setdefault(name, dict(getattr(processor, name)))
    return [write_json_file(staging, IMAGE_PROCESSOR_FILE, settings)]


class EncoderDecoderImageTextToTextRecipe(RecipeDefaults):
    """Transformers.js's folder of an encoder-decoder vision-language model."""

    def accepts(self, loaded: LoadedModel, request: ExportRequest) -> Refusal | None:
        from transformers import AutoImageProcessor

        if (refusal := transformers_js_refusal(loaded.config) or precision_refusal(loaded, request, FLOAT_ONLY)) is not None:
            return refusal
        if (why := DTYPE_CAUSES.get(weights_dtype(loaded))) is not None:
            return Refusal(NotImplementedError, (
                f"{type(loaded.model).__name__} ({loaded.config.model_type}) is written in float32 alone: {why}. Nothing "
                "was written. Give --dtype float32 (dtype=\"float32\")."
            ))
        try:
            florence2.image_side(AutoImageProcessor.from_pretrained(loaded.folder))
        except NotImplementedError as error:  # images of other sizes than the vision model's one
            return Refusal(NotImplementedError, str(error))
        return None

    def export(
        self, loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, request: ExportRequest, say: Say,
    ) -> list[str]:
        from transformers import AutoImageProcessor

        files = florence2.export_folder(loaded, staging, options, AutoImageProcessor.from_pretrained(loaded.folder))
        say(transformers_js_note(loaded.config))
        return files + write_processor_files(Path(loaded.folder), staging, loaded.config)

    def verify(
        self, loaded: LoadedModel, folder: Path, model: torch.nn.Module, request: ExportRequest, tolerance: Tolerance,
        say: Say,
    ) -> Verification:
        names = dict(zip(("vision", "embedding", "encoder", "decoder"), florence2.FILES))
        files = {part: folder / onnx_file(loaded, name) for part, name in names.items()}
        return verify_florence2(files, model, Path(loaded.folder), request.tokens, tolerance)


TRANSFORMERS_JS_RECIPE = EncoderDecoderImageTextToTextRecipe()
