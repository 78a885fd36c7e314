"""Each image-text-to-text architecture's row (fx2onnx/hub/vision_language/), on tiny
configs and image processors, with no export: the runtime type, the row width the runtime
sizes `image_features` and `inputs_embeds` by, genai_config.json's vision section,
genai_processor_config.json's steps, what export-hf says of the image sizes, the
verification's image sizes, the refusals before anything is written, and which rows get
Transformers.js's folder (`--runtime standard`)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fx2onnx.hub.loading import IMAGE_TEXT_TO_TEXT
from fx2onnx.hub.recipe_table import recipe_for
from fx2onnx.hub.recipes import image_text_to_text
from fx2onnx.hub.vision_language import (
    architecture, florence2, folder_verification, gemma3, gemma3_transformers_js, gemma3n, gemma4, genai_files, glm_ocr,
    idefics3,
    lighton_ocr, llava, mistral3, paligemma, parts, qwen2_5_vl, qwen2_vl, qwen3_5, qwen3_vl, qwen_images, transformers_js,
)
from fx2onnx.hub.vision_language.architectures import ARCHITECTURES, architecture_of

transformers = pytest.importorskip("transformers")


def _qwen2_5_vl():
    config = transformers.Qwen2_5_VLConfig(text_config=dict(hidden_size=64), vision_config=dict(window_size=56))
    processor = transformers.Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 64)
    return config, processor


def _qwen3_vl():
    config = transformers.Qwen3VLConfig(text_config=dict(hidden_size=64),
                                        vision_config=dict(patch_size=16, deepstack_visual_indexes=[0, 1, 2]))
    processor = transformers.Qwen2VLImageProcessorPil(patch_size=16, min_pixels=32 * 32, max_pixels=32 * 32 * 64)
    return config, processor


def _gemma3():
    return transformers.Gemma3Config(), transformers.Gemma3ImageProcessorPil(size={"height": 64, "width": 48})


def _mistral3():
    config = transformers.Mistral3Config(vision_config=dict(model_type="pixtral", patch_size=14, image_size=112),
                                         text_config=dict(model_type="mistral", hidden_size=64), spatial_merge_size=2)
    processor = transformers.PixtralImageProcessorPil(patch_size={"height": 28, "width": 28}, size={"longest_edge": 112})
    return config, processor


TINY = {"qwen2_5_vl": _qwen2_5_vl, "qwen3_vl": _qwen3_vl, "gemma3": _gemma3, "mistral3": _mistral3}
# what each architecture's rows, vision section and processor are (the runtime's names)
EXPECTED = {
    "qwen2_5_vl": dict(width=64, mrope=True, vision_keys=["spatial_merge_size", "patch_size", "window_size", "tokens_per_second"],
                       grid=True, processor="qwen2_5_image_processor", note="between 3136 and 50176 pixels"),
    "qwen3_vl": dict(width=64 * 4, mrope=True, vision_keys=["spatial_merge_size", "patch_size", "window_size", "tokens_per_second"],
                     grid=True, processor="qwen2_5_image_processor", note="between 1024 and 65536 pixels"),
    "gemma3": dict(width=None, mrope=False, vision_keys=[], grid=False, processor="gemma_3_image_processing",
                   note="vision model for 64x48 images"),
    "mistral3": dict(width=64, mrope=False, vision_keys=["spatial_merge_size", "patch_size"], grid=False,
                     processor="pixtral_image_processor", note="up to 112 pixels a side"),
}


def test_every_row_has_its_tiny_config_here():
    assert set(ARCHITECTURES) == set(TINY) == set(EXPECTED)


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_an_architecture_row_writes_the_runtime_settings(model_type):
    config, processor = TINY[model_type]()
    architecture = architecture_of(config)
    expected = EXPECTED[model_type]
    assert architecture is ARCHITECTURES[model_type] and architecture.genai_type == model_type
    assert architecture.row_width(config) == (expected["width"] or int(config.text_config.hidden_size))
    assert architecture.mrope is expected["mrope"]

    section = architecture.vision_section(config, "onnx/vision_encoder.onnx", genai_files.PROCESSOR_CONFIG)
    assert list(section) == ["filename", "config_filename", "session_options", *expected["vision_keys"], "inputs", "outputs"]
    assert section["config_filename"] == "genai_processor_config.json"
    assert section["inputs"] == {"pixel_values": "pixel_values", **({"image_grid_thw": "image_grid_thw"} if expected["grid"] else {})}

    written = architecture.processor_config(processor, config)["processor"]
    assert written["name"] == expected["processor"]
    steps = [step["operation"]["type"] for step in written["transforms"]]
    # decoded to RGB first (a ConvertRGB after it only where the processor converts), scaled, normalized
    assert steps[0] == "DecodeImage" and {"Resize", "Rescale", "Normalize"} <= set(steps)
    assert expected["note"] in architecture.image_sizes_note(processor)

    sizes = architecture.verification_sizes(None if model_type != "mistral3" else _model_stub(config), processor)
    assert sizes and all(height > 0 and width > 0 for height, width in sizes)


def _model_stub(config):
    class Stub:
        pass

    stub = Stub()
    stub.config = config
    return stub


def test_mistral3_verification_images_are_multiples_of_the_merged_patch():
    config, processor = _mistral3()
    sizes = ARCHITECTURES["mistral3"].verification_sizes(_model_stub(config), processor)
    assert len(set(sizes)) == 2 and all(h % 28 == 0 and w % 28 == 0 for h, w in sizes)


def test_qwen_verification_images_are_not_multiples_of_the_merged_patch():
    config, processor = _qwen2_5_vl()
    sizes = ARCHITECTURES["qwen2_5_vl"].verification_sizes(None, processor)
    assert len(set(sizes)) == 2 and all(h % 28 and w % 28 for h, w in sizes)


def test_a_model_type_without_a_row_is_refused_naming_the_rows():
    with pytest.raises(NotImplementedError, match=f"for model types {', '.join(ARCHITECTURES)}; llava is not one of them"):
        architecture_of(transformers.LlavaConfig())


def test_a_row_refuses_a_configuration_its_runtime_type_cannot_run():
    with pytest.raises(NotImplementedError, match="puts 64 tokens per image"):
        architecture_of(transformers.Gemma3Config(mm_tokens_per_image=64))
    config, processor = _mistral3()
    processor.do_resize = False
    with pytest.raises(ValueError, match="does not resize"):
        mistral3.check_image_processor(processor, config)


def test_the_qwen_rows_share_the_qwen_processor_and_differ_in_their_rows():
    assert ARCHITECTURES["qwen2_5_vl"] is qwen2_5_vl.ARCHITECTURE
    assert qwen2_5_vl.ARCHITECTURE.processor_config is qwen3_vl.ARCHITECTURE.processor_config is qwen_images.processor_config
    assert qwen2_5_vl.ARCHITECTURE.wide_rows is None and qwen3_vl.ARCHITECTURE.wide_rows is not None
    with pytest.raises(ValueError, match="gives no pixel bounds"):
        qwen_images.pixel_bounds(transformers.Qwen2VLImageProcessorPil(size={"height": 224, "width": 224}))


def test_a_prompts_text_leaves_out_the_special_tokens():
    config = transformers.Qwen2_5_VLConfig(text_config=dict(vocab_size=6))
    text = architecture.prompt_text(config, {0, 1, 2})
    assert text and set(text) <= {3, 4, 5}


def test_the_embedding_takes_the_image_rows_in_order_and_keeps_the_rest():
    """Image tokens (counted across the batch) take the features' rows in order; text tokens
    and image tokens past the features (a decode step) keep their embedding; wide rows get
    zeros after a text token's embedding."""
    config = transformers.Qwen2_5_VLConfig(text_config=dict(hidden_size=8, vocab_size=20, num_hidden_layers=1,
                                                            num_attention_heads=2, num_key_value_heads=1, intermediate_size=16),
                                           vision_config=dict(depth=1, hidden_size=8, out_hidden_size=8, num_heads=2,
                                                              intermediate_size=16), image_token_id=19)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).eval()
    embedding = parts.Embedding(model, 19, width=12)
    ids = torch.tensor([[1, 19, 2, 19], [19, 3, 4, 5]])
    features = torch.arange(3 * 12, dtype=torch.float32).reshape(3, 12)
    with torch.no_grad():
        embeds = embedding(ids, features)["inputs_embeds"]
        table = model.model.language_model.embed_tokens.weight
    torch.testing.assert_close(embeds[0, 1], features[0])
    torch.testing.assert_close(embeds[0, 3], features[1])
    torch.testing.assert_close(embeds[1, 0], features[2])
    torch.testing.assert_close(embeds[0, 0], torch.cat([table[1], torch.zeros(4)]))
    with torch.no_grad():  # a decode step: no features, an image token keeps its embedding
        step = embedding(torch.tensor([[19]]), features[:0])["inputs_embeds"]
    torch.testing.assert_close(step[0, 0], torch.cat([table[19], torch.zeros(4)]))


def test_gemma3_refuses_an_image_token_count_the_runtime_lacks():
    with pytest.raises(NotImplementedError, match="always puts 256"):
        gemma3.check_image_tokens(SimpleNamespace(mm_tokens_per_image=64))
    gemma3.check_image_tokens(SimpleNamespace(mm_tokens_per_image=gemma3.RUNTIME_IMAGE_TOKENS))


def test_mistral3_image_tokens_are_merged_patches():
    config = SimpleNamespace(vision_config=SimpleNamespace(patch_size=14), spatial_merge_size=2)
    assert mistral3.merged_patch(config) == 28


def test_qwen3_vl_rows_carry_a_hidden_size_per_deepstack_block():
    qwen3 = SimpleNamespace(vision_config=SimpleNamespace(deepstack_visual_indexes=[1, 3]), text_config=SimpleNamespace(hidden_size=8))
    assert qwen3_vl.ARCHITECTURE.row_width(qwen3) == 24


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_transformers_js_folders_are_written_for_the_rows_run_in_transformers_js(model_type):
    """`--runtime standard` writes Transformers.js's layout for the architectures run in it;
    the others are refused naming the command that writes their ONNX Runtime GenAI folder."""
    config, _ = TINY[model_type]()
    refusal = transformers_js.transformers_js_refusal(config)
    if model_type in transformers_js.TRANSFORMERS_JS_ARCHITECTURES:
        assert refusal is None and "Transformers.js 4.3.2 runs this folder" in transformers_js.transformers_js_note(config)
    else:
        assert refusal.error_type is NotImplementedError
        assert f"{model_type} is not one of them. For {model_type}: " in refusal.message
        assert "--runtime onnxruntime, the default" in refusal.message
    assert recipe_for(IMAGE_TEXT_TO_TEXT, config, "standard") is image_text_to_text.TRANSFORMERS_JS_RECIPE
    assert recipe_for(IMAGE_TEXT_TO_TEXT, config, "onnxruntime") is image_text_to_text.RECIPE


def test_the_verification_merges_features_as_the_embedding_does():
    """Transformers.js's merge (the verification's, beside the token embedding alone) gives
    the rows the GenAI embedding gives: each image token the next feature row, in order."""
    config = transformers.Qwen2_5_VLConfig(text_config=dict(hidden_size=8, vocab_size=20, num_hidden_layers=1,
                                                            num_attention_heads=2, num_key_value_heads=1, intermediate_size=16),
                                           vision_config=dict(depth=1, hidden_size=8, out_hidden_size=8, num_heads=2,
                                                              intermediate_size=16), image_token_id=19)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).eval()
    ids = torch.tensor([[1, 19, 2, 19], [19, 3, 4, 5]])
    features = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        merging = parts.Embedding(model, 19, width=8)(ids, features)["inputs_embeds"].numpy()
        tokens = parts.TokenEmbedding(model)(ids)["inputs_embeds"].numpy()
    merged = folder_verification.merged_features(ids.numpy(), tokens, features.numpy(), 19)
    np.testing.assert_allclose(merged, merging, rtol=0, atol=0)
    assert not np.array_equal(tokens, merging)


# the architectures only Transformers.js runs: a tiny config of each (transformers_js.py's own rows)
TRANSFORMERS_JS_ONLY = {
    "qwen2_vl": (lambda: transformers.Qwen2VLConfig(), qwen2_vl.ARCHITECTURE),
    "qwen3_vl_moe": (lambda: transformers.Qwen3VLMoeConfig(), qwen3_vl.MOE_ARCHITECTURE),
    "glm_ocr": (lambda: transformers.GlmOcrConfig(), glm_ocr.ARCHITECTURE),
    "qwen3_5": (lambda: transformers.Qwen3_5Config(), qwen3_5.ARCHITECTURE),
    "qwen3_5_moe": (lambda: transformers.Qwen3_5MoeConfig(), qwen3_5.MOE_ARCHITECTURE),
    "llava": (lambda: transformers.LlavaConfig(), llava.ARCHITECTURE),
    "idefics3": (lambda: transformers.Idefics3Config(), idefics3.ARCHITECTURE),
    "smolvlm": (lambda: transformers.SmolVLMConfig(), idefics3.ARCHITECTURE),
    "lighton_ocr": (lambda: transformers.LightOnOcrConfig(), lighton_ocr.ARCHITECTURE),
    "paligemma": (lambda: transformers.PaliGemmaConfig(), paligemma.ARCHITECTURE),
}


# rows with the runtime's Qwen image processor: what ONNX Runtime GenAI lacks is their model type
QWEN_PROCESSED = ("qwen2_vl", "qwen3_vl_moe", "glm_ocr", "qwen3_5", "qwen3_5_moe")


@pytest.mark.parametrize("model_type", sorted(TRANSFORMERS_JS_ONLY))
def test_an_architecture_only_transformers_js_runs_gets_its_folder_alone(model_type):
    """`--runtime standard` writes its folder with the row's own architecture; the ONNX
    Runtime GenAI folder is refused naming `--runtime standard`."""
    make_config, expected = TRANSFORMERS_JS_ONLY[model_type]
    config = make_config()
    assert transformers_js.transformers_js_refusal(config) is None
    assert transformers_js.transformers_js_architecture(config) is expected
    assert transformers_js.TRANSFORMERS_JS_ARCHITECTURES[model_type].architecture is expected
    with pytest.raises(NotImplementedError, match=f"{model_type} is not one of them"):
        architecture_of(config)
    assert "--runtime standard` writes its folder for Transformers.js" in transformers_js.transformers_js_hint(config)
    if model_type not in QWEN_PROCESSED:  # Qwen's runtime processor; the type is what GenAI lacks
        with pytest.raises(NotImplementedError, match="ONNX Runtime GenAI 0.18 has no"):
            expected.vision_section(config, "vision_encoder.onnx", genai_files.PROCESSOR_CONFIG)


def test_qwen2_vl_vision_model_takes_the_grid_as_transformers_js_names_it():
    assert qwen2_vl.GRID_INPUT == "grid_thw" and qwen_images.GRID_INPUT == "image_grid_thw"
    images = {"image_grid_thw": torch.tensor([[1, 2, 2], [1, 2, 4]]), "pixel_values": torch.zeros(12, 4)}
    fed = []
    session = SimpleNamespace(run=lambda names, feed: fed.append(sorted(feed)) or [np.zeros((1, 2), np.float32)],
                              get_inputs=lambda: [SimpleNamespace(name="pixel_values"), SimpleNamespace(name="grid_thw")],
                              get_outputs=lambda: [SimpleNamespace(name="image_features")])
    qwen2_vl.ARCHITECTURE.image_features(session, images)
    assert fed == [["grid_thw", "pixel_values"]] * 2  # one image at a time, the grid as `grid_thw`


def test_idefics3_refuses_crops_of_another_side_than_the_tower():
    config = transformers.Idefics3Config(vision_config=dict(image_size=56, patch_size=14))
    idefics3.check_image_processor(transformers.Idefics3ImageProcessorPil(max_image_size={"longest_edge": 56}), config)
    with pytest.raises(ValueError, match="max_image_size.longest_edge is 364, the vision tower's image_size 56"):
        idefics3.check_image_processor(transformers.Idefics3ImageProcessorPil(max_image_size={"longest_edge": 364}), config)


def test_gemma3_transformers_js_folder_has_flagged_rows_and_the_genai_folder_its_own():
    """Gemma 3's Transformers.js folder is written by its own row (rows one column wider, the
    image flag), ONNX Runtime GenAI's by architectures.py's (the decoder reads `input_ids`)."""
    config = transformers.Gemma3Config()
    assert transformers_js.transformers_js_refusal(config) is None
    assert transformers_js.transformers_js_architecture(config) is gemma3_transformers_js.ARCHITECTURE
    assert architecture_of(config) is gemma3.ARCHITECTURE
    rows = torch.zeros(2, 3, 4)
    assert gemma3_transformers_js.flagged(rows, 1.0)[..., -1].eq(1).all() and gemma3_transformers_js.flagged(rows, 0.0).shape == (2, 3, 5)


@pytest.mark.parametrize("make_config, works", [
    (lambda: transformers.LlavaOnevisionConfig(), "Give --text-only to export its language model alone"),
])
def test_a_family_transformers_js_runs_but_export_hf_does_not_write_says_why_and_what_works(make_config, works):
    config = make_config()
    refusal = transformers_js.transformers_js_refusal(config)
    assert f"For {config.model_type}: {transformers_js.NOT_SERVED[config.model_type]}" in refusal.message
    assert works in refusal.message.split("Nothing was written. ")[1]


def test_florence2_gets_the_encoder_decoder_folder_for_transformers_js_alone(tmp_path):
    """Florence-2 (an encoder-decoder) is written by its own recipe with `--runtime standard`
    (four models, an encoder_model besides: florence2.py); the ONNX Runtime GenAI folder is
    refused by the image-text-to-text recipe, naming `--runtime standard`."""
    from fx2onnx.hub.loading import LoadedModel
    from fx2onnx.hub.recipes import encoder_decoder_image_text_to_text
    from fx2onnx.hub.request import ExportRequest

    config = transformers.Florence2Config()
    assert transformers_js.transformers_js_refusal(config) is None
    assert "encoder_model" in transformers_js.transformers_js_note(config)
    assert recipe_for(IMAGE_TEXT_TO_TEXT, config, "standard") is encoder_decoder_image_text_to_text.TRANSFORMERS_JS_RECIPE
    assert recipe_for(IMAGE_TEXT_TO_TEXT, config, "onnxruntime") is image_text_to_text.RECIPE
    loaded = LoadedModel(torch.nn.Linear(2, 2), config, tmp_path, IMAGE_TEXT_TO_TEXT, None)
    refusal = image_text_to_text.RECIPE.accepts(loaded, ExportRequest.resolve())
    assert refusal.error_type is not None and issubclass(refusal.error_type, NotImplementedError)
    assert "florence2 is not one of them" in refusal.message
    # its default task is text2text-generation (an encoder-decoder): the command names the task
    assert "--task image-text-to-text --runtime standard` writes its folder for Transformers.js 4.3.2" in refusal.message
    # its text2text-generation folder (the default task of an encoder-decoder) says what Transformers.js loads instead
    from fx2onnx.hub.recipes import seq2seq

    assert "--task image-text-to-text --runtime standard" in seq2seq.RECIPE.client_note(config.to_dict(), False)
    assert seq2seq.RECIPE.client_note(transformers.BartConfig().to_dict(), False) is None
    recipe = encoder_decoder_image_text_to_text.TRANSFORMERS_JS_RECIPE
    transformers.CLIPImageProcessorPil(size={"height": 32, "width": 48}, do_center_crop=False).save_pretrained(tmp_path)
    assert recipe.accepts(loaded, ExportRequest.resolve()) is None
    assert florence2.image_side(transformers.AutoImageProcessor.from_pretrained(tmp_path)) == (32, 48)
    # an image processor giving other sizes than the vision model's one: refused before anything is written
    transformers.CLIPImageProcessorPil(size={"shortest_edge": 32}).save_pretrained(tmp_path)
    refusal = recipe.accepts(loaded, ExportRequest.resolve())
    assert refusal.error_type is NotImplementedError and "not one height and width" in refusal.message
    assert "Nothing was written" in refusal.message
    assert "int4" in recipe.accepts(loaded, ExportRequest.resolve(precision="int4")).message
    for dtype, cause in ((torch.float16, "torch.isfinite"), (torch.bfloat16, "no bfloat16 dtype")):
        half = LoadedModel(torch.nn.Linear(2, 2).to(dtype), config, tmp_path, IMAGE_TEXT_TO_TEXT, None)
        refusal = recipe.accepts(half, ExportRequest.resolve(dtype=str(dtype).removeprefix("torch.")))
        assert refusal.error_type is NotImplementedError and cause in refusal.message and "--dtype float32" in refusal.message


def gemma4_config(audio: bool = True, **text) -> object:
    """A Gemma 4 configuration with a vision tower, an audio tower where ``audio``, and ``text``'s entries."""
    return transformers.Gemma4Config(text_config=transformers.Gemma4TextConfig(**text).to_dict(),
                                     vision_config=transformers.Gemma4VisionConfig().to_dict(),
                                     audio_config=transformers.Gemma4AudioConfig().to_dict() if audio else None)


@pytest.mark.parametrize("config, cause", [
    (lambda: transformers.Gemma4Config(), "has no vision tower"),
    (lambda: gemma4_config(audio=False), "loads onnx/audio_encoder.onnx for Gemma4ForConditionalGeneration"),
    (lambda: gemma4_config(use_bidirectional_attention="vision"), "src/models/gemma3n/modeling_gemma3n.js:78-91"),
])
def test_gemma4_folder_transformers_js_cannot_run_is_refused_with_its_cause(config, cause):
    """Gemma 4's Transformers.js row refuses, before anything is written, a model without a vision
    tower, one without an audio tower (Transformers.js loads an audio_encoder whatever the prompt) and
    one whose image tokens attend each other both ways (Transformers.js feeds no mm_token_type_ids)."""
    config = config()
    assert transformers_js.transformers_js_refusal(config) is None  # the model type has a row
    with pytest.raises(NotImplementedError, match="Nothing was written") as error:
        transformers_js.transformers_js_architecture(config)
    assert cause in str(error.value)
    assert transformers_js.transformers_js_architecture(gemma4_config()) is gemma4.ARCHITECTURE


def test_gemma3n_has_its_own_transformers_js_row():
    config = transformers.Gemma3nConfig()
    assert transformers_js.transformers_js_refusal(config) is None and "gemma3n" not in transformers_js.NOT_SERVED
    assert transformers_js.transformers_js_architecture(config) is gemma3n.ARCHITECTURE
    assert "(Gemma3nForConditionalGeneration)" in transformers_js.transformers_js_note(config)


def test_gemma3n_without_timm_is_an_error_naming_what_to_install(tmp_path, monkeypatch):
    """Gemma 3n's vision tower is timm's: where timm cannot be imported, export-hf says so and
    which extra to install before it builds the model, and writes nothing."""
    import sys

    from fx2onnx.hub import export_hf

    transformers.Gemma3nConfig().save_pretrained(tmp_path / "source")  # a configuration alone: the model is not built
    monkeypatch.setitem(sys.modules, "timm", None)  # `import timm` raises ImportError
    with pytest.raises(ImportError, match=r"timm's mobilenetv5_300m_enc") as error:
        export_hf(tmp_path / "source", tmp_path / "out", task="image-text-to-text", runtime="standard")
    assert 'pip install "fx2onnx[vision]"' in str(error.value) and "Nothing was written" in str(error.value)
    assert not (tmp_path / "out").exists()


def test_florence2_encoder_inputs_have_numeric_sizes_while_the_vision_exports_fakes_live(tmp_path):
    """Florence-2 in fake mode: the encoder's example inputs run the vision tower on the example
    images, which the vision export was given as fakes with symbolic dims; while those fakes live
    (until the collector frees the export's reference cycles) the tower still runs on numeric sizes
    (its window padding takes numbers only): the rows of 17 image tokens and 5 prompt tokens."""
    import fx2onnx
    from fx2onnx.hub.loading import LoadedModel
    from fx2onnx.hub.shared.program_files import fake_inputs

    text = dict(vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
                encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)
    vision = dict(depths=[1, 1], patch_size=[7, 3], patch_stride=[4, 2], patch_padding=[3, 1], patch_prenorm=[False, True],
                  embed_dim=[16, 32], num_heads=[2, 4], num_groups=[2, 4], window_size=2, projection_dim=32,
                  max_position_embeddings=16, max_temporal_embeddings=8)
    config = transformers.Florence2Config(text_config=text, vision_config=vision, image_token_id=63)
    with fx2onnx.enable_fake_mode() as fake_context:
        model = transformers.Florence2ForConditionalGeneration(config).eval()
    loaded = LoadedModel(model, config, tmp_path, IMAGE_TEXT_TO_TEXT, fake_context)
    processor = transformers.CLIPImageProcessorPil(size={"height": 32, "width": 32}, do_center_crop=False)
    examples = florence2.example_inputs(loaded, processor)
    held = fake_inputs({"pixel_values": examples["pixel_values"]}, loaded)  # the vision export's inputs, not collected
    assert isinstance(held["pixel_values"].shape[2], torch.SymInt)
    encoder = florence2._encoder_inputs(loaded, examples)
    assert encoder["inputs_embeds"].shape == (florence2.IMAGES, 17 + florence2.PROMPT, 32)
    assert all(isinstance(size, int) for size in encoder["inputs_embeds"].shape)
