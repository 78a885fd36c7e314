"""Phi-4-multimodal as ONNX Runtime GenAI's `phi4mm` type: the folder generates through the
runtime's own `MultiModalProcessor` what transformers generates with its own image
processor (which needs torchvision) on the original images and with its own feature
extractor on the original audio clips, and `--verify` chains the four models on two
images' processed inputs, one of them of 1 x 2 crops with padding, and two audio clips',
one of them padded."""

from __future__ import annotations

import json
import wave

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.vision_language.folder_verification import random_images
from fx2onnx.hub.whisper.whisper_verify import speech_signal, write_wav

pytest.importorskip("torchvision", reason="transformers' Phi-4 image processor needs torchvision", exc_type=ImportError)
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
Image = pytest.importorskip("PIL.Image")

from test_export_hf_vision_language import genai_tokens  # noqa: E402

pytestmark = pytest.mark.vision

# the runtime's processor writes images as <|endoftext10|> (id 200010), audio as <|endoftext11|> (200011)
SPECIAL = {"<|endoftext|>": 199999, "<|endoftext10|>": 200010, "<|endoftext11|>": 200011, "<|assistant|>": 200019,
           "<|end|>": 200020, "<|user|>": 200021}
PROMPT = "<|user|><|image_1|>describe this image<|end|><|assistant|>"
# single-crop images (the global image is then the crop itself): one as large as a crop, one
# scaled up to it. An image of several crops gets a global image scaled down, which the
# runtime's processor does with antialiasing and transformers' without (documented)
IMAGE_SIZES = [(448, 448), (100, 100)]
AUDIO_PROMPT = "<|user|><|audio_1|>transcribe<|end|><|assistant|>"
# 16 kHz clips of 16 and 9 audio tokens (128 and 72 frames of 10 ms, one token per 8)
CLIP_SECONDS = [1.3, 0.75]


def phi4_tokenizer():
    """A byte-level BPE tokenizer trained here, with Phi-4's special tokens at their ids."""
    model = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    model.train_from_iterator(["the quick brown fox jumps over the lazy dog", "describe this image user assistant"] * 40, trainer)
    data = json.loads(model.to_str())
    data["model"]["vocab"].update(SPECIAL)  # the ids the runtime's processor expects
    data["added_tokens"] = [dict(id=i, content=t, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
                            for t, i in SPECIAL.items()]
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer.from_str(json.dumps(data)), bos_token="<|endoftext|>",
        eos_token="<|endoftext|>", pad_token="<|endoftext|>",
    )


def save_phi4mm(folder):
    """A two-layer Phi-4-multimodal (two vision layers at the runtime's 448-pixel crops, one
    conformer block), with transformers' image processor."""
    config = transformers.Phi4MultimodalConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        bos_token_id=199999, eos_token_id=199999, pad_token_id=199999,
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2),
        audio_config=dict(hidden_size=32, intermediate_size=64, num_blocks=1, num_attention_heads=2, nemo_conv_channels=32,
                          depthwise_separable_out_channel=32, ext_pw_out_channel=32, kernel_size=3, num_lang=1),
    )
    torch.manual_seed(0)
    model = transformers.Phi4MultimodalForCausalLM(config).eval()
    with torch.no_grad():  # weights large enough that the tokens depend on the image
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, 0.3)
    model.save_pretrained(folder)
    tokenizer = phi4_tokenizer()
    tokenizer.save_pretrained(folder)
    image_processor = transformers.Phi4MultimodalImageProcessor()
    image_processor.save_pretrained(folder)  # the audio feature extractor's settings: its defaults
    return model, image_processor, tokenizer


def transformers_tokens(model, image_processor, tokenizer, path, new_tokens: int) -> list[int]:
    """`model.generate` on transformers' image processor's inputs, the image's placeholder
    expanded to its image tokens as Phi4MultimodalProcessor does."""
    images = image_processor(images=[Image.open(path)], return_tensors="pt")
    text = PROMPT.replace("<|image_1|>", "<|endoftext10|>" * int(images["num_img_tokens"][0]))
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        generated = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), image_pixel_values=images["image_pixel_values"],
            image_sizes=images["image_sizes"], image_attention_mask=images["image_attention_mask"],
            max_new_tokens=new_tokens, do_sample=False,
        )
    return generated[0, ids.shape[1]:].tolist()


def transformers_audio_tokens(model, tokenizer, path, new_tokens: int, image_processor=None, image=None) -> list[int]:
    """`model.generate` on transformers' feature extractor's inputs for the clip at
    ``path`` (and its image processor's for the ``image`` file, the image first in the
    prompt), each placeholder expanded to its tokens as Phi4MultimodalProcessor does."""
    with wave.open(str(path)) as clip:
        samples = np.frombuffer(clip.readframes(clip.getnframes()), dtype="<i2").astype(np.float32) / 32768
    audio = transformers.Phi4MultimodalFeatureExtractor()(samples, sampling_rate=16000, return_tensors="pt")
    text = AUDIO_PROMPT.replace("<|audio_1|>", "<|endoftext11|>" * int(audio["audio_embed_sizes"][0]))
    inputs = {"audio_input_features": audio["audio_input_features"], "audio_embed_sizes": audio["audio_embed_sizes"]}
    if image is not None:
        images = image_processor(images=[Image.open(image)], return_tensors="pt")
        text = text.replace("<|user|>", "<|user|>" + "<|endoftext10|>" * int(images["num_img_tokens"][0]))
        inputs.update(image_pixel_values=images["image_pixel_values"], image_sizes=images["image_sizes"],
                      image_attention_mask=images["image_attention_mask"])
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        generated = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), **inputs, max_new_tokens=new_tokens, do_sample=False,
        )
    return generated[0, ids.shape[1]:].tolist()


def genai_audio_tokens(folder, path, new_tokens: int, image=None) -> list[int]:
    """Greedy tokens of ONNX Runtime GenAI with its multimodal processor on the clip at
    ``path`` (and the ``image`` file, first in the prompt)."""
    prompt = AUDIO_PROMPT if image is None else AUDIO_PROMPT.replace("<|user|>", "<|user|><|image_1|>")
    return genai_tokens(folder, [image] if image is not None else [], new_tokens, prompt, max_length=2048, audio_paths=[path])


@pytest.fixture(scope="module")
def phi4mm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("phi4mm")
    saved = save_phi4mm(folder / "source")
    result = export_hf(folder / "source", folder / "out", verify=True)
    paths = [folder / f"image{index}.png" for index in range(len(IMAGE_SIZES))]
    for path, pixels in zip(paths, random_images(tuple(IMAGE_SIZES))):
        Image.fromarray(pixels).save(path)
    return saved, folder / "out", result, paths


@pytest.fixture(scope="module")
def clips(phi4mm):
    _, out, _, _ = phi4mm
    paths = [out.parent / f"clip{index}.wav" for index in range(len(CLIP_SECONDS))]
    for path, seconds in zip(paths, CLIP_SECONDS):
        write_wav(path, speech_signal(16000, seconds), 16000)
    return paths


def test_phi4mm_folder_layout(phi4mm):
    _, out, result, _ = phi4mm
    # --verify: two images (1 x 2 crops with padding, and one crop) and two clips (one padded) in one prompt, 16 tokens equal
    assert result.verification.passed and result.verification.max_logit_difference < 1e-4
    for name in ("vision_encoder", "speech_encoder", "embed_tokens", "decoder_model_merged"):
        onnx.checker.check_model(str(out / "onnx" / f"{name}.onnx"), full_check=True)
    vision = onnx.load(str(out / "onnx" / "vision_encoder.onnx"), load_external_data=False)
    assert [i.name for i in vision.graph.input] == ["pixel_values", "image_attention_mask", "image_sizes"]
    embedding = onnx.load(str(out / "onnx" / "embed_tokens.onnx"), load_external_data=False)
    assert [i.name for i in embedding.graph.input] == ["input_ids", "image_features", "audio_features"]
    config = json.loads((out / "genai_config.json").read_text())["model"]
    assert config["type"] == "phi4mm" and config["vision"]["config_filename"] == "vision_processor.json"
    assert config["speech"]["filename"] == "onnx/speech_encoder.onnx"
    assert config["speech"]["config_filename"] == "speech_processor.json"
    speech = onnx.load(str(out / "onnx" / "speech_encoder.onnx"), load_external_data=False)
    assert [i.name for i in speech.graph.input] == ["audio_embeds", "audio_attention_mask", "audio_sizes", "audio_projection_mode"]
    assert [o.name for o in speech.graph.output] == ["audio_features"]
    steps = json.loads((out / "speech_processor.json").read_text())["feature_extraction"]["sequence"]
    assert [step["operation"]["type"] for step in steps] == ["AudioDecoderEx", "Phi4AudioEmbed"]
    transforms = json.loads((out / "vision_processor.json").read_text())["processor"]["transforms"]
    assert [t["operation"]["type"] for t in transforms][1::3] == ["Phi4VisionDynamicPreprocess", "Phi4VisionProcessor"]


@pytest.mark.parametrize("image", range(len(IMAGE_SIZES)))
def test_phi4mm_folder_generates_as_transformers(phi4mm, image):
    (model, image_processor, tokenizer), out, _, paths = phi4mm
    expected = transformers_tokens(model, image_processor, tokenizer, paths[image], 16)
    assert len(expected) == 16 and len(set(expected)) > 3
    assert genai_tokens(out, [paths[image]], 16, PROMPT, max_length=2048) == expected


def test_the_tiny_model_answers_each_image_otherwise(phi4mm):
    (model, image_processor, tokenizer), _, _, paths = phi4mm
    answers = {tuple(transformers_tokens(model, image_processor, tokenizer, path, 16)) for path in paths}
    assert len(answers) == 2


def test_phi4mm_folder_generates_as_transformers_on_audio(phi4mm, clips):
    # the runtime's own processor (log-mel of its own) on each clip, against transformers'
    # feature extractor: the speech projection (a prompt without images), two lengths
    (model, _, tokenizer), out, _, _ = phi4mm
    answers = []
    for path in clips:
        expected = transformers_audio_tokens(model, tokenizer, path, 16)
        assert len(expected) == 16 and len(set(expected)) > 3
        assert genai_audio_tokens(out, path, 16) == expected
        answers.append(tuple(expected))
    assert answers[0] != answers[1]  # the tokens depend on the clip


def test_phi4mm_folder_generates_as_transformers_on_an_image_and_audio(phi4mm, clips):
    # the runtime's mode 3 (images and audio): the vision-speech projection, as transformers picks it
    (model, image_processor, tokenizer), out, _, paths = phi4mm
    expected = transformers_audio_tokens(model, tokenizer, clips[0], 16, image_processor, paths[0])
    assert len(expected) == 16 and expected != transformers_audio_tokens(model, tokenizer, clips[0], 16)
    assert genai_audio_tokens(out, clips[0], 16, paths[0]) == expected


def test_the_speech_model_stops_past_the_encoders_span(phi4mm):
    # 4000 frames: 500 subsampled, the model's unchunked side; 4008: 501, which the model
    # would cut into chunks: the runtime stops instead of giving other features
    _, out, _, _ = phi4mm
    session = onnxruntime.InferenceSession(str(out / "onnx" / "speech_encoder.onnx"), providers=["CPUExecutionProvider"])
    for frames, fits in ((4000, True), (4008, False)):
        feed = {"audio_embeds": np.zeros((1, frames, 80), np.float32), "audio_attention_mask": np.ones((1, frames), bool),
                "audio_sizes": np.array([-(-frames // 8)]), "audio_projection_mode": np.array([2])}
        if fits:
            assert session.run(None, feed)[0].shape == (500, 32)
        else:
            with pytest.raises(Exception, match="GatherND"):
                session.run(None, feed)


def test_phi4mm_in_fake_mode_streams_the_weights(phi4mm, tmp_path):
    # the vision layers after the one the image embedding reads are dropped from the graph
    # while its fake weights are hidden (fake_weights.swapped_initializers); without the
    # speech model the runtime's config names none
    _, out, _, _ = phi4mm
    result = export_hf(out.parent / "source", tmp_path / "out", fake=True, verify=True, without_audio=True)
    assert result.verification.passed and result.verification.max_logit_difference < 1e-4
    config = json.loads((tmp_path / "out" / "genai_config.json").read_text())["model"]
    assert config["speech"] == {"filename": "", "config_filename": ""}
    assert not (tmp_path / "out" / "onnx" / "speech_encoder.onnx").exists()
    assert not (tmp_path / "out" / "speech_processor.json").exists()
    vision = onnx.load(str(tmp_path / "out" / "onnx" / "vision_encoder.onnx"), load_external_data=False)
    assert not any(".encoder.layers.1." in weight.name for weight in vision.graph.initializer)
