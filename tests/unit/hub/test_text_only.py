"""Refusals of multimodal models that name a command that works: a text-generation export
that would leave encoders out needs --text-only, and an image-text-to-text type without a
runtime layout names --text-only where transformers has a causal LM for its language model."""

from __future__ import annotations

import pytest

from fx2onnx.hub.decoders import text_only

from fx2onnx.hub.vision_language.architectures import architecture_of
transformers = pytest.importorskip("transformers")

# the image-text-to-text types export-hf refuses, each with a causal LM for its language model
REFUSED_TYPES = ["llava", "idefics3", "smolvlm", "qwen2_vl", "llava_next", "internvl"]


def test_a_text_generation_folder_of_phi4_multimodal_needs_the_option():
    config = transformers.Phi4MultimodalConfig()
    assert text_only.left_out_parts(config) == ["vision encoder", "audio encoder"]
    with pytest.raises(text_only.PartsLeftOutError) as error:
        text_only.check_parts_kept(config, "Phi4MultimodalForCausalLM")
    message = str(error.value)
    assert message.startswith("Phi4MultimodalForCausalLM (phi4_multimodal) has a vision encoder and an audio encoder")
    assert "Nothing was written" in message and "Give --text-only" in message


def test_a_text_model_keeps_every_part():
    assert text_only.left_out_parts(transformers.LlamaConfig()) == []
    text_only.check_parts_kept(transformers.LlamaConfig(), "LlamaForCausalLM")


@pytest.mark.parametrize("model_type", REFUSED_TYPES)
def test_an_image_text_to_text_refusal_names_the_text_only_export(model_type):
    config = transformers.AutoConfig.for_model(model_type)
    with pytest.raises(NotImplementedError) as error:
        architecture_of(config)
    message = str(error.value)
    assert f"{model_type} is not one of them. Nothing was written. Give --text-only" in message
    assert "--task text-generation" not in message
    assert text_only.can_export_text_only(config)


def test_a_language_model_without_a_causal_lm_class_names_the_python_export():
    config = transformers.AutoConfig.for_model("kosmos-2")
    assert not text_only.can_export_text_only(config)
    assert "fx2onnx.dynamo_export" in text_only.command_hint(config) and "--text-only" not in text_only.command_hint(config)


def test_qwen2_vl_text_runs_as_qwen2():
    config = transformers.Qwen2VLConfig(text_config=dict(hidden_size=64, num_hidden_layers=3, vocab_size=500))
    twin = text_only.text_config_of(config)
    assert twin.model_type == "qwen2"
    assert (twin.hidden_size, twin.num_hidden_layers, twin.vocab_size) == (64, 3, 500)


def test_a_prefix_lm_has_no_text_only_folder():
    config = transformers.PaliGemmaConfig()
    assert not text_only.can_export_text_only(config)
    with pytest.raises(NotImplementedError, match="paligemma is not one of them. Nothing was written. Its language model attends "
                       "both ways over the prompt, .* export its modules with fx2onnx.dynamo_export"):
        architecture_of(config)


def test_gemma3_with_an_image_token_count_the_runtime_lacks_names_the_text_only_export():
    config = transformers.Gemma3Config(mm_tokens_per_image=64)
    with pytest.raises(NotImplementedError, match="puts 64 tokens per image .* Give --text-only to export its language model"):
        architecture_of(config)
