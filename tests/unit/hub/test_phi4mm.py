"""Phi-4-multimodal's phi4mm parts: the vision model's layout of every image in one graph
equals the image embedding's loop over the images; the configurations the runtime's
processor cannot feed, and the runtimes without a layout, are refused with what works."""

from __future__ import annotations

import pytest
import torch

from fx2onnx.hub.recipes.phi4mm_genai import RECIPE
from fx2onnx.hub.request import ExportRequest
from fx2onnx.hub.vision_language import phi4_multimodal
from fx2onnx.hub.vision_language.phi4_multimodal_verify import verify_phi4mm  # noqa: F401 - the recipe's verification

transformers = pytest.importorskip("transformers")


def tiny_model(**vision):
    config = transformers.Phi4MultimodalConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, **vision),
        audio_config=dict(hidden_size=32, intermediate_size=64, num_blocks=1, num_attention_heads=2, nemo_conv_channels=32,
                          depthwise_seperable_out_channel=32, ext_pw_out_channel=32, kernel_size=3, num_lang=1),
    )
    torch.manual_seed(0)
    return transformers.Phi4MultimodalForCausalLM(config).eval()


def test_the_vision_layout_equals_the_image_embeddings_loop():
    model = tiny_model()
    images = phi4_multimodal.example_images()  # 1 x 2 crops with padded columns, and one crop (a padding crop after it)
    wide = {k: v[:1].clone() for k, v in images.items()}  # 2 x 1 crops, padded rows, alone
    wide["image_sizes"] = torch.tensor([[2 * phi4_multimodal.CROP, phi4_multimodal.CROP]])
    wide["image_attention_mask"][:] = 1
    wide["image_attention_mask"][0, 2, -7:, :] = 0
    for inputs in (images, wide):
        counts = phi4_multimodal.image_token_counts(inputs["image_attention_mask"], inputs["image_sizes"])
        ids = torch.full((1, sum(counts)), phi4_multimodal.IMAGE_TOKEN_ID)
        with torch.no_grad():
            ours = phi4_multimodal.Phi4Vision(model)(**inputs)["image_features"]
            theirs = model.model.embed_tokens_extend.image_embed(
                ids, model.model.embed_tokens(ids), inputs["pixel_values"], inputs["image_sizes"], inputs["image_attention_mask"])
        torch.testing.assert_close(ours, theirs[0], rtol=0, atol=0)


def test_a_model_the_runtimes_processor_cannot_feed_is_refused():
    config = tiny_model(image_size=56, crop_size=56).config
    with pytest.raises(NotImplementedError, match="vision_config.crop_size is 56 \\(the runtime's processor needs 448\\)"):
        phi4_multimodal.check(config)


def test_an_image_processor_of_other_crops_is_refused():
    with pytest.raises(NotImplementedError, match="448-pixel crops of 14-pixel patches"):
        phi4_multimodal.vision_processor_config({"size": {"height": 224, "width": 224}})
    steps = phi4_multimodal.vision_processor_config({"dynamic_hd": 9})["processor"]["transforms"]
    assert steps[1]["operation"]["attrs"] == {"dynamic_hd": 9, "dyhd_base_resolution": 448}
    assert steps[2]["operation"]["inputs"] == [":0"]  # the crops' image, not their mask


def test_runtime_standard_is_refused_with_the_command_that_works():
    class Loaded:
        config = tiny_model().config
    refusal = RECIPE.accepts(Loaded(), ExportRequest.resolve(runtime="standard", without_audio=True))
    assert refusal is not None and "`fx2onnx export-hf <model> --output <folder>` writes the GenAI folder" in refusal.message


def test_the_folder_without_its_audio_encoder_needs_the_option():
    class Loaded:
        config = tiny_model().config
    refusal = RECIPE.accepts(Loaded(), ExportRequest.resolve())
    assert refusal is not None and "Give --without-audio to write that folder" in refusal.message
    assert "--text-only" in refusal.message
