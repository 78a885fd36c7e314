"""Gemma 3n's image-text-to-text folder for Transformers.js (`--runtime standard`): vision_encoder
(timm's MobileNetV5, which needs timm and torchvision: the vision environment), audio_encoder (the
USM conformer), embed_tokens with per-layer inputs and decoder_model_merged, loaded as written by
Transformers.js's Gemma3nForConditionalGeneration in Node and checked against transformers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from fx2onnx.hub import export_hf

pytest.importorskip("torchvision", reason="Gemma 3n's vision tower is timm's, which imports torchvision", exc_type=ImportError)
pytest.importorskip("timm", reason="transformers builds Gemma 3n's vision tower with timm", exc_type=ImportError)
transformers = pytest.importorskip("transformers")

from test_transformers_js import (  # noqa: E402
    NEW_TOKENS, assert_generates_as_transformers, assert_per_layer_folder, checked_graphs, client_tensors,
    jobs_and_greedy_rows, left_padded_batch, random_image, run_in_transformers_js, shapes,
    transformers_js,  # noqa: F401 (fixture)
)

pytestmark = pytest.mark.vision

# Gemma 3n's token layout in a vocabulary of 400: the text's 256 (per-layer inputs too), then the vision vocabulary
# (72 ids from 256: the end of an image, the image token) and the audio vocabulary (72 from 328: the end of a clip,
# the audio token), as the checkpoints lay out theirs (262144 and 262272)
TOKENS = dict(boi_token_id=250, eoi_token_id=256, image_token_id=257, boa_token_id=251, eoa_token_id=328,
              audio_token_id=329, vision_soft_tokens_per_image=16, audio_soft_tokens_per_image=12)
IMAGE_SIDE = 128
# the texts of those tokens, as the tokenizer's special tokens name them (both clients' Gemma3nProcessor reads them)
TOKEN_TEXTS = {"boi_token": "<start_of_image>", "boa_token": "<start_of_audio>", "eoi_token": "<end_of_image>",
               "image_token": "<image_soft_token>", "eoa_token": "<end_of_audio>", "audio_token": "<audio_soft_token>"}
# the tower's block kinds (timm's MobileNetV5: edge residual, universal inverted residual, multi-query attention
# with its keys and values downsampled), a stage ending as the checkpoints' do (timm's feature taps read a stage's
# last block's pointwise convolution, which an attention block has not)
TOWER = [["er_r1_k3_s2_e4_c16"], ["uir_r1_a3_k5_s2_e6_c16"],
         ["uir_r1_a5_k5_s2_e6_c32", "mqa_r1_k3_h2_v2_s1_d8_c32", "uir_r1_a0_k0_s1_e2_c32"],
         ["uir_r1_a5_k5_s2_e6_c32", "mqa_r1_k3_h2_s1_d8_c32", "uir_r1_a0_k0_s1_e2_c32"]]


def image_processor():
    # the checkpoints' processor: one size, pixels rescaled to [0, 1] and not normalized (the tower's own mean and std)
    return transformers.SiglipImageProcessorPil(size={"height": IMAGE_SIDE, "width": IMAGE_SIDE}, do_normalize=False)


def save_gemma3n_processor(folder: Path) -> None:
    """Gemma3nProcessor as transformers 5 saves it (processor_config.json, the image processor and
    the feature extractor nested) with a byte-level BPE tokenizer of 400 tokens: 120 trained, then
    Gemma 3n's special tokens at TOKENS' ids among unused ones."""
    import tokenizers

    model = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=120, special_tokens=["<pad>", "<eos>", "<bos>"], initial_alphabet=[])
    model.train_from_iterator(["the quick brown fox jumps over the lazy dog describe this image and audio\n\n"] * 40, trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=model, bos_token="<bos>", eos_token="<eos>",
                                                     pad_token="<pad>")
    ids = {TOKENS[name.replace("_token", "_token_id")]: text for name, text in TOKEN_TEXTS.items()}
    tokenizer.add_special_tokens({"additional_special_tokens": [ids.get(i, f"<unused{i}>") for i in range(len(tokenizer), 400)]})
    assert tokenizer.convert_tokens_to_ids(list(ids.values())) == list(ids)
    tokenizer.save_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, extra_special_tokens=TOKEN_TEXTS)
    transformers.Gemma3nProcessor(
        feature_extractor=transformers.Gemma3nAudioFeatureExtractor(), image_processor=image_processor(), tokenizer=tokenizer,
        chat_template="{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}",
        image_seq_length=TOKENS["vision_soft_tokens_per_image"], audio_seq_length=TOKENS["audio_soft_tokens_per_image"],
    ).save_pretrained(folder)


def save_gemma3n(folder: Path) -> torch.nn.Module:
    """A tiny Gemma 3n as its E2B and E4B checkpoints are: per-layer inputs, AltUp, LAuReL, a sparse
    first layer, sliding layers of 8 tokens and the last sliding and full layer reusing the earlier
    layers' keys and values; timm's MobileNetV5 encoder cut to eight blocks of its three kinds (its
    fused 2048-wide output as the checkpoints', the 8 x 8 map of a 128-pixel image pooled to 4 x 4,
    as theirs 48 x 48 to 16 x 16: 16 tokens an image); a two-layer conformer of chunks of 12
    (12 tokens a clip); the checkpoints' image processor at 128 pixels, in Gemma3nProcessor."""
    from timm.models._efficientnet_builder import decode_arch_def

    torch.manual_seed(0)
    text = transformers.Gemma3nTextConfig(
        vocab_size=400, vocab_size_per_layer_input=256, hidden_size=32, hidden_size_per_layer_input=8,
        intermediate_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        layer_types=["sliding_attention", "full_attention"] * 2, num_kv_shared_layers=2, sliding_window=8,
        laurel_rank=8, activation_sparsity_pattern=[0.95, 0.0, 0.0, 0.0], max_position_embeddings=256)
    vision = transformers.Gemma3nVisionConfig(
        vocab_size=72, vocab_offset=256, model_args={"block_args": decode_arch_def(TOWER), "msfa_output_resolution": 4})
    audio = transformers.Gemma3nAudioConfig(
        vocab_size=72, vocab_offset=328, hidden_size=32, conf_num_hidden_layers=2, conf_num_attention_heads=2,
        sscp_conv_channel_size=[8, 4], conf_conv_kernel_size=3)
    config = transformers.Gemma3nConfig(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                        audio_config=audio.to_dict(), **TOKENS)
    model = transformers.Gemma3nForConditionalGeneration(config).eval()
    # timm's builder writes into the block arguments it is given (their layers, their kind popped): the saved
    # config gets them as given, as a checkpoint holds them
    model.config.vision_config.model_args = {"block_args": decode_arch_def(TOWER), "msfa_output_resolution": 4}
    model.save_pretrained(folder)
    save_gemma3n_processor(folder)
    return model


def gemma3n_prompts(model: torch.nn.Module) -> tuple[list[dict], list[list[list[int]]]]:
    """transformers' processed inputs (as Gemma3nProcessor lays out the tokens) of a wide image, a tall
    one, a prompt without an image, an audio clip, an image and the clip in one prompt, and a
    left-padded batch of two images; transformers' 16 greedy tokens after each."""
    config = model.config
    processor = image_processor()
    text = [5, 17, 42, 8, 9, 3, 77, 31]
    image = [config.boi_token_id, *[config.image_token_id] * config.vision_soft_tokens_per_image, config.eoi_token_id]
    clip_tokens = [config.boa_token_id, *[config.audio_token_id] * config.audio_soft_tokens_per_image, config.eoa_token_id]

    def pixels(*images) -> dict:
        return {"pixel_values": processor(images=list(images), return_tensors="pt")["pixel_values"]}

    def row(ids: list[int], **inputs) -> dict:
        return {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.int64), **inputs}

    clip = np.random.default_rng(2).standard_normal(12000).astype(np.float32) * 0.1
    audio = transformers.Gemma3nAudioFeatureExtractor()([clip], sampling_rate=16000, return_tensors="pt")
    clip_inputs = {"input_features": audio["input_features"], "input_features_mask": audio["input_features_mask"]}
    prompts = [
        row([2, *text[:3], *image, *text[3:]], **pixels(random_image(30, 50, 0))),
        row([2, *text[:3], *image, *text[3:]], **pixels(random_image(70, 25, 1))),
        row([2, *text]),
        row([2, *text[:2], *clip_tokens, *text[2:]], **clip_inputs),
        row([2, *text[:2], *image, *clip_tokens, *text[2:]], **pixels(random_image(50, 30, 5)), **clip_inputs),
    ]
    prompts.append(left_padded_batch([[2, *text[:3], *image, *text[3:]], [2, *text[:2], *image, *text[2:5]]],
                                      **pixels(random_image(40, 40, 3), random_image(20, 60, 4))))
    return jobs_and_greedy_rows(model, prompts)


# clips for Transformers.js's own processor (samples at 16 kHz): 12100 samples give both clients 73 log-mel frames;
# 12000, padded to 12032, whose length less the 512-sample frame is a multiple of the 160-sample hop, give
# Transformers.js's 73 (src/models/gemma3n/feature_extraction_gemma3n.js:34-38: frames of frame_length samples)
# and transformers' 72 (frames of frame_length + 1)
CLIENT_CLIPS = (12100, 12000)


def client_prompts(scratch: Path) -> list[dict]:
    """Prompts for Transformers.js's Gemma3nProcessor: an image of the processor's size (not
    resized), one it resizes, and each of CLIENT_CLIPS."""
    prompts = []
    for seed, (height, width) in enumerate(((IMAGE_SIDE, IMAGE_SIDE), (40, 60))):
        path = scratch / f"{height}x{width}.png"
        random_image(height, width, 20 + seed).save(path)
        prompts.append({"text": "<bos>describe <image_soft_token> this image", "images": [str(path)]})
    for samples in CLIENT_CLIPS:
        clip = np.random.default_rng(samples).standard_normal(samples).astype(np.float32) * 0.1
        prompts.append({"text": "<bos>describe <audio_soft_token> this audio", "audio": clip.tolist()})
    return prompts


def assert_client_processor(model: torch.nn.Module, source: Path, prompts: list[dict], results: list[dict]) -> None:
    """Transformers.js's Gemma3nProcessor against transformers' on client_prompts: the ids equal
    (both put newlines around an image's and a clip's tokens), the unresized image's pixels
    within 1e-6, the resized one's sharp's (other values); the 12100-sample clip's features within
    5e-5 and its mask equal, the 12000-sample clip one frame longer; and on every prompt
    Transformers.js's 16 greedy tokens transformers' on the inputs its processor gave."""
    from PIL import Image

    processor = transformers.AutoProcessor.from_pretrained(source)
    pixels, audio = [], []
    for prompt, result in zip(prompts, results):
        client = client_tensors(result["processed"])
        if "images" in prompt:
            expected = processor(text=prompt["text"], images=[Image.open(prompt["images"][0])], return_tensors="pt")
            pixels.append(float((client["pixel_values"] - expected["pixel_values"]).abs().max()))
        else:
            expected = processor(text=prompt["text"], audio=[np.array(prompt["audio"], dtype=np.float32)], return_tensors="pt")
            audio.append((client["input_features"], client["input_features_mask"], expected))
        assert torch.equal(client["input_ids"], expected["input_ids"])
        inputs = {name: value for name, value in client.items() if name != "token_type_ids"}
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        assert result["generated"] == out[0, client["input_ids"].shape[1]:].tolist()
    assert pixels[0] <= 1e-6 < 0.1 < pixels[1]
    (features, mask, expected), (longer, _, shorter) = audio
    assert features.shape == expected["input_features"].shape == (1, 73, 128)
    torch.testing.assert_close(features, expected["input_features"], rtol=0, atol=5e-5)
    assert torch.equal(mask, expected["input_features_mask"])
    assert longer.shape[1] == shorter["input_features"].shape[1] + 1 == 73
    torch.testing.assert_close(longer[:, :72], shorter["input_features"], rtol=0, atol=5e-5)


def test_gemma3n_image_audio_folder_in_transformers_js(tmp_path, transformers_js):
    """Gemma 3n as `--runtime standard` writes it for Transformers.js's Gemma3nForConditionalGeneration.
    export-hf's verification (two images of other sizes in one prompt, and the audio model on two
    batches of clips of other lengths, each with a padded clip, against the rows transformers merges)
    passes in onnxruntime; 16 greedy tokens in Transformers.js equal
    transformers' on a wide image, a tall one, a prompt without an image, an audio clip, an image
    and the clip in one prompt, and a left-padded batch of two images, past the sliding window of 8;
    and through Transformers.js's own Gemma3nProcessor, which the folder names (assert_client_processor)."""
    model = save_gemma3n(tmp_path / "source")
    out = tmp_path / "out"
    said = []
    verification = export_hf(tmp_path / "source", out, task="image-text-to-text", runtime="standard", verify=True,
                             tokens=NEW_TOKENS, say=said.append).verification
    assert verification.passed and verification.onnx_tokens == verification.torch_tokens
    assert verification.max_logit_difference < 1e-4
    assert [line for line in said if "(Gemma3nForConditionalGeneration)" in line]
    graphs = checked_graphs(out, ("vision_encoder", "audio_encoder", "embed_tokens", "decoder_model_merged"))
    assert shapes(graphs["vision_encoder"].input) == {"pixel_values": ["pixel_values_dim_0", 3, IMAGE_SIDE, IMAGE_SIDE]}
    assert shapes(graphs["vision_encoder"].output)["image_features"][1:] == [16, 32]
    assert shapes(graphs["audio_encoder"].output)["audio_features"][1:] == [12, 32]
    assert shapes(graphs["embed_tokens"].output) == {"inputs_embeds": ["batch_size", "sequence_length", 32],
                                                     "per_layer_inputs": ["batch_size", "sequence_length", 4, 8]}
    assert_per_layer_folder(out, graphs, "gemma3n", "Gemma3nForConditionalGeneration", stored_layers=2)
    settings = json.loads((out / "preprocessor_config.json").read_text())
    assert settings["processor_class"] == "Gemma3nProcessor" and settings["feature_extractor_type"] == "Gemma3nAudioFeatureExtractor"
    prompts, expected = gemma3n_prompts(model)
    own = client_prompts(tmp_path)
    job = {"folder": str(out), "task": "image-text-to-text", "image_text": {"prompts": prompts + own, "new_tokens": NEW_TOKENS}}
    done = run_in_transformers_js(transformers_js, tmp_path, job)["image_text"]
    assert_client_processor(model, tmp_path / "source", own, done[len(prompts):])
    results = [result["generated_rows"] for result in done[:len(prompts)]]
    assert results == expected
    assert len({str(rows) for rows in expected[:5]}) == 5  # the images and the audio changed the tokens


def test_gemma3n_text_only_folder_in_transformers_js(tmp_path, transformers_js):
    """Gemma 3n's language model alone (`--text-only`, its towers left out): Transformers.js's
    text-generation class for gemma3n loads the folder's embedding and decoder (config.json names
    Gemma3nForConditionalGeneration, with no vision or audio config), and its 16 greedy tokens
    equal transformers' from that language model (the checkpoint's weights in Gemma3nForCausalLM,
    as export-hf loads it) alone and as a left-padded batch, past the sliding window of 8;
    export-hf verifies the model and the pair in onnxruntime. (The random model generates ids of
    the vision and audio vocabularies, 256 to 399, which the whole model embeds with its towers'
    embedders and its language model alone with its text table: the whole model's tokens differ.)"""
    from fx2onnx.hub.loading import load_model

    save_gemma3n(tmp_path / "source")
    model = load_model(tmp_path / "source", None, None, fake=False, text_only=True).model
    assert type(model).__name__ == "Gemma3nForCausalLM"
    out = tmp_path / "out"
    said = []
    verification = export_hf(tmp_path / "source", out, text_only=True, verify=True, tokens=NEW_TOKENS,
                             say=said.append).verification
    assert verification.passed and verification.tokens_equal
    assert [line for line in said if "(Transformers.js's models) too" in line]
    graphs = checked_graphs(out, ("model", "embed_tokens", "decoder_model_merged"))
    assert shapes(graphs["embed_tokens"].output)["per_layer_inputs"] == ["batch_size", "sequence_length", 4, 8]
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gemma3n" and config["architectures"] == ["Gemma3nForConditionalGeneration"]
    assert "vision_config" not in config and "audio_config" not in config
    assert not (out / "onnx" / "vision_encoder.onnx").exists()
    assert_generates_as_transformers(transformers_js, tmp_path, out, model)


def test_gemma3n_towers_with_module_functions(tmp_path):
    """The vision and audio models as `fx2onnx.dynamo_export` writes them by default, each module
    call an ONNX function (a `--runtime standard` folder is one flat graph): in onnxruntime, on
    more images and longer clips than the export's, within 1e-5 of transformers' image features
    and of the audio rows it merges (a clip cut short among them)."""
    from torch.export import Dim

    import fx2onnx
    from fx2onnx.hub.vision_language import gemma3n

    model = save_gemma3n(tmp_path / "source")
    pixels = image_processor()(images=[random_image(30 + 9 * i, 50, i) for i in range(3)], return_tensors="pt")["pixel_values"]
    clips = {"input_features": torch.randn(2, 157, 128, generator=torch.Generator().manual_seed(3)),
             "input_features_mask": torch.arange(157).expand(2, 157) < torch.tensor([[157], [61]])}
    exports = {
        "vision": (gemma3n.Gemma3nVision(model), {"pixel_values": pixels[:2]}, {"pixel_values": {0: Dim.AUTO}}),
        "audio": (gemma3n.Gemma3nAudio(model), {name: value[:, :120] for name, value in clips.items()},
                  {name: {0: Dim.AUTO, 1: Dim.AUTO} for name in clips}),
    }
    with torch.no_grad():
        expected = {"vision": model.model.get_image_features(pixels).pooler_output.numpy(),
                    "audio": gemma3n.merged_audio_rows(model, clips).numpy()}
    for name, (module, example, dims) in exports.items():
        program = fx2onnx.dynamo_export(module, **example, export_options=fx2onnx.ExportOptions(dynamic_shapes=dims))
        path = tmp_path / f"{name}.onnx"
        program.save(path)
        onnx.checker.check_model(os.fspath(path), full_check=True)
        assert onnx.load(path, load_external_data=False).functions
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        feed = {"pixel_values": pixels} if name == "vision" else clips
        got = session.run(None, {key: value.numpy() for key, value in feed.items()})[0]
        np.testing.assert_allclose(got, expected[name], rtol=0, atol=1e-5)
