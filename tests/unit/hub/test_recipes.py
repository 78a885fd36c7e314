"""export-hf's recipes without an export: which recipe the table gives each task and
runtime, and what each recipe's `accepts` refuses (the options it declares), on tiny
configs and a stand-in model."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, LlamaConfig, T5Config, Wav2Vec2Config, WhisperConfig

from fx2onnx.hub.loading import (
    FEATURE_EXTRACTION, IMAGE_CLASSIFICATION, IMAGE_TEXT_TO_TEXT, SPEECH_RECOGNITION, TASKS, TEXT2TEXT, TEXT_GENERATION,
    LoadedModel,
)
from fx2onnx.hub.pipeline_tasks import PIPELINE_TASKS, TEXT_CLASSIFICATION
from fx2onnx.hub.precision.folder_precision import FLOAT_ONLY, PrecisionSupport, folder_quantization, precision_refusal
from fx2onnx.hub.recipe_table import RECIPES, recipe_for
from fx2onnx.hub.recipes import causal_lm, encoder, image_text_to_text, pipeline_task, seq2seq, whisper_genai
from fx2onnx.hub.recipes.folder_recipe import FolderRecipe
from fx2onnx.hub.request import REFUSED_COMBINATIONS, ExportRequest, Refusal
from fx2onnx.hub.tasks import UnsupportedArchitectureError

TINY = {"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 16, "vocab_size": 32}


def _loaded(task: str, config, tmp_path, dtype: torch.dtype = torch.float32) -> LoadedModel:
    return LoadedModel(torch.nn.Linear(2, 2).to(dtype), config, tmp_path, task, None)


def _whisper() -> WhisperConfig:
    return WhisperConfig(d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                         decoder_attention_heads=2, vocab_size=32)


@pytest.mark.parametrize(("task", "config", "runtime", "recipe"), [
    (TEXT_GENERATION, LlamaConfig(**TINY), "onnxruntime", causal_lm.RECIPE),
    (TEXT2TEXT, T5Config(d_model=8, num_layers=1, num_heads=2, vocab_size=32), "standard", seq2seq.RECIPE),
    (SPEECH_RECOGNITION, _whisper(), "onnxruntime", whisper_genai.RECIPE),
    (SPEECH_RECOGNITION, _whisper(), "standard", seq2seq.RECIPE),
    (SPEECH_RECOGNITION, Wav2Vec2Config(), "onnxruntime", pipeline_task.RECIPE),
    (FEATURE_EXTRACTION, BertConfig(**TINY), "onnxruntime", encoder.RECIPE),
    (IMAGE_CLASSIFICATION, BertConfig(**TINY), "standard", encoder.RECIPE),
    (IMAGE_TEXT_TO_TEXT, LlamaConfig(**TINY), "onnxruntime", image_text_to_text.RECIPE),
    (TEXT_CLASSIFICATION, BertConfig(**TINY), "standard", pipeline_task.RECIPE),
])
def test_the_table_gives_one_recipe_per_task_and_runtime(task, config, runtime, recipe):
    assert recipe_for(task, config, runtime) is recipe


@pytest.mark.parametrize("runtime", ["onnxruntime", "standard"])
def test_every_task_has_a_recipe_with_the_protocol(runtime):
    for task in TASKS:
        recipe = recipe_for(task, BertConfig(**TINY), runtime)
        assert isinstance(recipe.special_tokens, bool)
        assert all(callable(getattr(recipe, name)) for name in ("accepts", "export", "verify", "client_note"))
    # the one recipe whose tokenizer adds no special tokens: Whisper's prompt carries them
    assert [r for r in set(RECIPES.values()) if not r.special_tokens] == [whisper_genai.RECIPE]
    assert set(PIPELINE_TASKS) - {SPEECH_RECOGNITION} <= {task for task, _ in RECIPES}


def _request(**options) -> ExportRequest:
    return ExportRequest.resolve(**options)


def test_a_causal_lm_accepts_every_weight_only_option(tmp_path):
    loaded = _loaded(TEXT_GENERATION, LlamaConfig(**{**TINY, "num_hidden_layers": 8}), tmp_path)
    request = _request(precision="int4", block_size=64, accuracy_level=0, quantize_lm_head=False,
                       quantize_embedding=True, quantization_algorithm="search", mixed_precision=True)
    assert causal_lm.RECIPE.accepts(loaded, request) is None
    quantization = folder_quantization(loaded, request)
    assert quantization.bits == 4 and quantization.block_size == 64 and not quantization.lm_head
    # mixed precision: the sensitive projections of the first and last eighth of the layers get 8 bits
    assert "*layers.0.*down_proj.weight" in quantization.int8_layers
    assert "*layers.7.*v_proj.weight" in quantization.int8_layers and not any("layers.1." in p for p in quantization.int8_layers)


@pytest.mark.parametrize(("options", "dtype", "error", "words"), [
    ({"precision": "int4"}, torch.float32, NotImplementedError, "no 4-bit form"),
    ({"precision": "int8", "quantize_embedding": True}, torch.float32, NotImplementedError, "drop quantize_embedding"),
    ({"precision": "int8", "block_size": 64}, torch.float32, ValueError, "takes none of them"),
    ({"precision": "int8", "quantize_lm_head": False}, torch.float32, ValueError, "takes none of them"),
    ({"precision": "int8", "module_functions": True}, torch.float32, ValueError, "drop module_functions"),
    ({"precision": "int8", "dtype": "float16"}, torch.float16, ValueError, "computes in float32"),
])
def test_an_encoders_int8_refuses_what_dynamic_quantization_has_not(tmp_path, options, dtype, error, words):
    loaded = _loaded(FEATURE_EXTRACTION, BertConfig(**TINY), tmp_path, dtype)
    refusal = encoder.RECIPE.accepts(loaded, _request(**options))
    assert isinstance(refusal, Refusal) and refusal.error_type is error and words in refusal.message
    assert isinstance(refusal.error(), error)


def test_an_encoder_accepts_int8_and_an_image_classifier_only_float(tmp_path):
    assert encoder.RECIPE.accepts(_loaded(FEATURE_EXTRACTION, BertConfig(**TINY), tmp_path), _request(precision="int8")) is None
    refusal = encoder.RECIPE.accepts(_loaded(IMAGE_CLASSIFICATION, BertConfig(**TINY), tmp_path), _request(precision="int8"))
    assert refusal.error_type is NotImplementedError and "image-classification folders are float" in refusal.message
    assert encoder.RECIPE.accepts(_loaded(IMAGE_CLASSIFICATION, BertConfig(**TINY), tmp_path), _request(precision="fp32")) is None


@pytest.mark.parametrize(("recipe", "task", "config"), [
    (seq2seq.RECIPE, TEXT2TEXT, T5Config(d_model=8, num_layers=1, num_heads=2, vocab_size=32)),
    (whisper_genai.RECIPE, SPEECH_RECOGNITION, _whisper()),
    (pipeline_task.RECIPE, TEXT_CLASSIFICATION, BertConfig(**TINY)),
])
def test_float_only_recipes_refuse_quantization_naming_the_task(tmp_path, recipe, task, config):
    loaded = _loaded(task, config, tmp_path)
    assert recipe.accepts(loaded, _request(precision="bf16")) is None
    refusal = recipe.accepts(loaded, _request(precision="int8"))
    assert refusal.error_type is NotImplementedError and f"{task} folders are float" in refusal.message


def test_mixed_precision_is_refused_where_nothing_is_quantized_weight_only(tmp_path):
    loaded = _loaded(FEATURE_EXTRACTION, BertConfig(**TINY), tmp_path)
    request = ExportRequest(mixed_precision=True)  # unresolved: no quantization to check first
    refusal = precision_refusal(loaded, request, FLOAT_ONLY)
    assert refusal.error_type is NotImplementedError and "drop it" in refusal.message
    assert precision_refusal(loaded, request, PrecisionSupport(weight_only=True)) is None


def test_an_image_text_to_text_type_without_a_layout_is_refused(tmp_path):
    refusal = image_text_to_text.RECIPE.accepts(_loaded(IMAGE_TEXT_TO_TEXT, LlamaConfig(**TINY), tmp_path), _request())
    # refused as an architecture export-hf writes no such folder for (a NotImplementedError)
    assert refusal.error_type is UnsupportedArchitectureError and issubclass(UnsupportedArchitectureError, NotImplementedError)
    assert "llama" in refusal.message


@pytest.mark.parametrize(("options", "words"), [
    ({"precision": "int4", "quantize_embedding": True, "module_functions": True}, "quantize_embedding quantizes"),
    ({"precision": "int4", "pack_projections": True, "module_functions": True}, "pack_projections packs"),
    ({"runtime": "standard", "module_functions": True}, "runtime standard writes one flat graph"),
    ({"precision": "int8", "mixed_precision": True}, "precision is int8: give int4"),
    ({"precision": "int4", "mixed_precision": True, "module_functions": True}, "chooses layers of one flat graph"),
])
def test_the_request_refuses_combinations_for_every_folder(options, words):
    with pytest.raises(ValueError, match=words):
        _request(**options)
    assert len(REFUSED_COMBINATIONS) == 5


def test_the_request_resolves_precision_into_dtype_and_quantization():
    request = _request(precision="int8", block_size=64)
    assert (request.dtype, request.quantization.bits, request.quantization.block_size) == ("float32", 8, 64)
    assert (_request(precision="fp16").dtype, _request(precision="fp16").quantization) == ("float16", None)


def test_every_recipe_is_a_folder_recipe():
    def check(recipe: FolderRecipe) -> bool:  # the protocol's names, as a type checker sees them
        return all(hasattr(recipe, name) for name in FolderRecipe.__annotations__)
    assert all(check(recipe) for recipe in RECIPES.values())
