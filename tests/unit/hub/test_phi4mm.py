"""Phi-4-multimodal's phi4mm parts: the vision model's layout of every image in one graph
equals the image embedding's loop over the images, the speech model's every clip in one
call the audio embedding's run per clip; the configurations the runtime's processor cannot
feed, and the runtimes without a layout, are refused with what works."""

from __future__ import annotations

import json

import pytest
import torch

from fx2onnx.hub.recipes.phi4mm_genai import RECIPE
from fx2onnx.hub.request import ExportRequest
from fx2onnx.hub.vision_language import phi4_multimodal, phi4_speech
from fx2onnx.hub.vision_language.phi4_multimodal_verify import verify_phi4mm  # noqa: F401 - the recipe's verification

transformers = pytest.importorskip("transformers")


def tiny_model(**vision):
    config = transformers.Phi4MultimodalConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, **vision),
        audio_config=dict(hidden_size=32, intermediate_size=64, num_blocks=1, num_attention_heads=2, nemo_conv_channels=32,
                          depthwise_separable_out_channel=32, ext_pw_out_channel=32, kernel_size=3, num_lang=1),
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


def test_a_feature_extractor_the_runtimes_processor_cannot_follow_is_refused_naming_without_audio(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"audio_compression_rate": 4, "dynamic_hd": 36}))

    class Loaded:
        config = tiny_model().config
        folder = str(tmp_path)
    refusal = RECIPE.accepts(Loaded(), ExportRequest.resolve())
    assert refusal is not None and "audio_compression_rate is 4 (the runtime's processor needs 8)" in refusal.message
    assert "--without-audio writes the folder for images and text" in refusal.message and "--text-only" in refusal.message


@pytest.mark.parametrize("chunk, left", [(3, 1), (4, 0), (-1, 18)])
def test_the_tensor_streaming_mask_equals_the_encoders(chunk, left):
    encoder = tiny_model().model.embed_tokens_extend.audio_embed.encoder
    for frames in (1, 5, 12, 13):  # within one chunk, past several, a partial last chunk
        expected = encoder._streaming_mask(frames, 2, chunk, left)
        assert torch.equal(phi4_speech.streaming_mask(frames, 2, chunk, left), expected.to(torch.bool))


def test_the_speech_model_of_every_clip_in_one_call_equals_the_audio_embedding_per_clip():
    # two clips, the second padded; the speech projection alone (mode 2) and the
    # vision-speech one (mode 3: images in the prompt)
    model = tiny_model()
    embed = model.model.embed_tokens_extend.audio_embed
    inputs = phi4_speech.example_audio(80)
    for mode, projection in ((2, "speech"), (3, "vision")):
        inputs["audio_projection_mode"] = torch.tensor([mode])
        with torch.no_grad():
            ours = phi4_speech.Phi4Speech(model)(**inputs)["audio_features"]
            theirs = []
            for clip, (frames, size) in enumerate(zip(inputs["audio_attention_mask"].sum(1), inputs["audio_sizes"])):
                ids = torch.full((1, int(size)), phi4_multimodal.AUDIO_TOKEN_ID)
                one = embed(ids, torch.zeros(1, int(size), 32), inputs["audio_embeds"][clip:clip + 1, :frames],
                            audio_embed_sizes=size[None], audio_projection_mode=projection)
                theirs.append(one[0])
        torch.testing.assert_close(ours, torch.cat(theirs), rtol=1e-5, atol=1e-5)
