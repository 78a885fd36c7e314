"""Which recipe writes a folder: one table from (folder task, runtime) to recipe.

The folder task is the loaded model's task, except for speech recognition, whose folder
kinds differ by model: a CTC model's one pass, Whisper's two models (for ONNX Runtime
GenAI with runtime onnxruntime), another encoder-decoder's Optimum layout.
"""

from __future__ import annotations

from typing import Any

from fx2onnx.hub.loading import (
    CAUSAL_LM_IMAGE_TEXT_TO_TEXT, FEATURE_EXTRACTION, IMAGE_CLASSIFICATION, IMAGE_TEXT_TO_TEXT, SPEECH_RECOGNITION, TEXT2TEXT,
    TEXT_GENERATION, is_ctc,
)
from fx2onnx.hub.pipeline_tasks import PIPELINE_TASKS, TEXT_TO_AUDIO
from fx2onnx.hub.recipes import (
    audio_text_to_text, causal_lm, encoder, encoder_decoder_image_text_to_text, image_text_to_text, phi4mm_genai, pipeline_task, seq2seq,
    speecht5_text_to_audio, text_to_audio, whisper_genai,
)
from fx2onnx.hub.recipes.folder_recipe import FolderRecipe

ANY_RUNTIME = "*"
CTC_SPEECH_RECOGNITION = "automatic-speech-recognition (CTC)"
WHISPER_SPEECH_RECOGNITION = "automatic-speech-recognition (Whisper)"
PHI4MM_IMAGE_TEXT_TO_TEXT = "image-text-to-text (Phi-4-multimodal)"
# an encoder-decoder vision-language model (Florence-2): Transformers.js loads an encoder_model besides
ENCODER_DECODER_IMAGE_TEXT_TO_TEXT = "image-text-to-text (encoder-decoder)"
# a decoder-only language model with an audio encoder, which transformers files under sequence-to-sequence
AUDIO_TEXT_TO_TEXT = "text2text-generation (audio language model)"
# SpeechT5's spectrogram, step by step, and its vocoder (VITS's text-to-audio is one pass)
SPECTROGRAM_TEXT_TO_AUDIO = "text-to-audio (SpeechT5)"
# the speech models ONNX Runtime GenAI runs as encoder and decoder (config.model_type)
GENAI_SPEECH_MODEL_TYPES = ("whisper",)

RECIPES: dict[tuple[str, str], FolderRecipe] = {
    (TEXT_GENERATION, ANY_RUNTIME): causal_lm.RECIPE,
    (TEXT2TEXT, ANY_RUNTIME): seq2seq.RECIPE,
    (SPEECH_RECOGNITION, ANY_RUNTIME): seq2seq.RECIPE,
    (WHISPER_SPEECH_RECOGNITION, "onnxruntime"): whisper_genai.RECIPE,
    (WHISPER_SPEECH_RECOGNITION, "standard"): seq2seq.RECIPE,
    (CTC_SPEECH_RECOGNITION, ANY_RUNTIME): pipeline_task.RECIPE,
    (FEATURE_EXTRACTION, ANY_RUNTIME): encoder.RECIPE,
    (IMAGE_CLASSIFICATION, ANY_RUNTIME): encoder.RECIPE,
    (IMAGE_TEXT_TO_TEXT, ANY_RUNTIME): image_text_to_text.RECIPE,
    (IMAGE_TEXT_TO_TEXT, "standard"): image_text_to_text.TRANSFORMERS_JS_RECIPE,
    (PHI4MM_IMAGE_TEXT_TO_TEXT, ANY_RUNTIME): phi4mm_genai.RECIPE,
    # ONNX Runtime GenAI has no encoder-decoder vision-language type: the image-text-to-text recipe refuses it
    (ENCODER_DECODER_IMAGE_TEXT_TO_TEXT, ANY_RUNTIME): image_text_to_text.RECIPE,
    (ENCODER_DECODER_IMAGE_TEXT_TO_TEXT, "standard"): encoder_decoder_image_text_to_text.TRANSFORMERS_JS_RECIPE,
    (AUDIO_TEXT_TO_TEXT, ANY_RUNTIME): audio_text_to_text.RECIPE,
    **{(task, ANY_RUNTIME): pipeline_task.RECIPE for task in PIPELINE_TASKS if task not in (SPEECH_RECOGNITION, TEXT_TO_AUDIO)},
    (TEXT_TO_AUDIO, ANY_RUNTIME): text_to_audio.RECIPE,
    (SPECTROGRAM_TEXT_TO_AUDIO, ANY_RUNTIME): speecht5_text_to_audio.RECIPE,
}


def folder_task(task: str, config: Any) -> str:
    """The key of ``task`` in `RECIPES` for a model of ``config``."""
    if is_ctc(task, config):
        return CTC_SPEECH_RECOGNITION
    if task == SPEECH_RECOGNITION and getattr(config, "model_type", None) in GENAI_SPEECH_MODEL_TYPES:
        return WHISPER_SPEECH_RECOGNITION
    if task == IMAGE_TEXT_TO_TEXT and getattr(config, "model_type", None) in CAUSAL_LM_IMAGE_TEXT_TO_TEXT:
        return PHI4MM_IMAGE_TEXT_TO_TEXT
    if task == IMAGE_TEXT_TO_TEXT and getattr(config, "is_encoder_decoder", False):
        return ENCODER_DECODER_IMAGE_TEXT_TO_TEXT
    if task == TEXT_TO_AUDIO and getattr(config, "model_type", None) == "speecht5":
        return SPECTROGRAM_TEXT_TO_AUDIO
    if task == TEXT2TEXT and not getattr(config, "is_encoder_decoder", False):
        return AUDIO_TEXT_TO_TEXT
    return task


def recipe_for(task: str, config: Any, runtime: str) -> FolderRecipe:
    """The recipe that writes ``task``'s folder of a model of ``config`` for ``runtime``."""
    key = folder_task(task, config)
    return RECIPES.get((key, runtime)) or RECIPES[(key, ANY_RUNTIME)]
