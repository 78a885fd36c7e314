"""`fx2onnx export-hf` on image-text-to-text models: ONNX Runtime GenAI folders whose
vision, embedding and decoder models and image processor generate what transformers'
`model.generate` does on its own processor's inputs; and the task of a checkpoint whose
architecture export-hf does not serve is an error before anything is written."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from fx2onnx.cli.main import main
from fx2onnx.hub import export_hf
from fx2onnx.hub.tasks import UnsupportedTaskError
from fx2onnx.hub.shared.verification import tolerance_for
from fx2onnx.hub.vision_language.architectures import ARCHITECTURES
from fx2onnx.hub.vision_language.folder_verification import verify_image_text_to_text
from test_export_hf import plant_error

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
Image = pytest.importorskip("PIL.Image")

QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def qwen_prompt(images: int) -> str:
    return f"<|im_start|>user\n{QWEN_IMAGE * images}describe this image<|im_end|>\n<|im_start|>assistant\n"


# (height, width) of the test images: three aspect ratios, no side a multiple of a merged
# patch (28 pixels for Qwen2.5-VL, 32 for Qwen3-VL); the last has more pixels than either
# test processor's max_pixels, so both processors resize it down, the others to the nearest grid
QWEN_IMAGE_SIZES = [(45, 75), (130, 60), (300, 260)]


def trained_tokenizer(special: list[str], **roles: str):
    """A byte-level BPE tokenizer trained here (nothing downloaded), with the model's special tokens."""
    model = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=special, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()
    )
    model.train_from_iterator(["the quick brown fox jumps over the lazy dog", "describe this image user assistant"] * 40, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=model, **roles)


def save_qwen2_5_vl(folder):
    """A two-layer Qwen2.5-VL (two vision layers, windowed then full attention) with its
    tokenizer, chat template and image processor."""
    vision = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64, patch_size=14,
                  spatial_merge_size=2, window_size=56, fullatt_block_indexes=[1], temporal_patch_size=2)
    return save_qwen(folder, transformers.Qwen2_5_VLConfig, transformers.Qwen2_5_VLForConditionalGeneration, vision)


def save_qwen(folder, config_class, model_class, vision: dict):
    """A Qwen vision-language model with a two-layer text model and the ``vision`` config,
    Qwen's tokenizer, chat template and an image processor of patch 14 and merge 2."""
    tokenizer = trained_tokenizer(QWEN_SPECIAL, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_SPECIAL}
    roles = dict(bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    config = config_class(
        text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, vocab_size=len(tokenizer), **roles,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], **roles,
    )
    torch.manual_seed(0)
    model = model_class(config).eval()
    model.save_pretrained(folder)
    transformers.Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 64).save_pretrained(folder)
    tokenizer.chat_template = QWEN_TEMPLATE
    tokenizer.save_pretrained(folder)
    return model


def transformers_tokens(folder, model, image_paths, new_tokens: int) -> list[int]:
    """Greedy tokens of `model.generate` on transformers' image processor's inputs for the
    image files as they are, each image's placeholder expanded to its grid's tokens as
    Qwen's processor does."""
    opened = [Image.open(path) for path in image_paths]
    images = transformers.AutoImageProcessor.from_pretrained(folder)(images=opened, return_tensors="pt")
    merge = model.config.vision_config.spatial_merge_size
    prompt = qwen_prompt(len(image_paths))
    for grid in images["image_grid_thw"]:  # one image's placeholder at a time, in order
        prompt = prompt.replace("<|image_pad|>", "<|placeholder|>" * (int(grid.prod()) // merge ** 2), 1)
    ids = transformers.AutoTokenizer.from_pretrained(folder)(prompt.replace("<|placeholder|>", "<|image_pad|>"),
                                                              return_tensors="pt")["input_ids"]
    with torch.no_grad():
        generated = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=images["pixel_values"],
            image_grid_thw=images["image_grid_thw"], mm_token_type_ids=(ids == model.config.image_token_id).long(),
            max_new_tokens=new_tokens, do_sample=False,
        )
    return generated[0, ids.shape[1]:].tolist()


def genai_tokens(folder, image_paths, new_tokens: int, prompt: str | None = None, max_length: int = 512,
                 audio_paths=()) -> list[int]:
    """Greedy tokens of ONNX Runtime GenAI with its multimodal processor on the image files
    (and audio files)."""
    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai does not install on this platform")
    model = og.Model(str(folder))
    images = og.Images.open(*[str(path) for path in image_paths]) if image_paths else None
    audios = og.Audios.open(*[str(path) for path in audio_paths]) if audio_paths else None
    inputs = model.create_multimodal_processor()(prompt or qwen_prompt(len(image_paths)), images=images, audios=audios)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, do_sample=False)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    tokens = []
    while not generator.is_done() and len(tokens) < new_tokens:
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokens


@dataclasses.dataclass
class QwenFolder:
    """A source checkpoint, its `export-hf --verify` folder and what the command printed."""

    model: torch.nn.Module
    source: Path
    out: Path
    printed: str


def exported_qwen(tmp_path_factory, save) -> QwenFolder:
    root = tmp_path_factory.mktemp("qwen")
    model = save(root / "source")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["export-hf", str(root / "source"), "--output", str(root / "out"), "--verify"]) == 0
    printed = printed.getvalue()
    assert "vision model for images of every size" in printed
    # --verify chains the three models in onnxruntime against model.generate on the processor's
    # inputs for a prompt with two images of different sizes
    assert re.search(r"verification: largest difference \S+ \(within the tolerance .*\), greedy tokens equal", printed)
    return QwenFolder(model, root / "source", root / "out", printed)


@pytest.fixture(scope="module")
def qwen2_5_vl(tmp_path_factory) -> QwenFolder:
    return exported_qwen(tmp_path_factory, save_qwen2_5_vl)


@pytest.fixture(scope="module")
def qwen3_vl(tmp_path_factory) -> QwenFolder:
    return exported_qwen(tmp_path_factory, save_qwen3_vl)


@pytest.fixture(scope="module")
def qwen_images(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("images")
    paths = [folder / f"{height}x{width}.png" for height, width in QWEN_IMAGE_SIZES]
    for seed, (path, size) in enumerate(zip(paths, QWEN_IMAGE_SIZES)):
        Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)).save(path)
    return paths


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_qwen_folder_generates_as_transformers_on_images_of_every_size(request, family, qwen_images):
    """One vision model for every image: the runtime's processor resizes each image as
    transformers' does and the vision model takes its grid; a prompt with two images of
    different sizes runs the vision model once per image."""
    folder = request.getfixturevalue(family)
    image_processor = transformers.AutoImageProcessor.from_pretrained(folder.source)
    grids = [tuple(image_processor(images=[Image.open(path)])["image_grid_thw"][0].tolist()) for path in qwen_images]
    assert len(set(grids)) == 3 and len({h / w for _, h, w in grids}) == 3
    answers = set()
    for images in ([qwen_images[0]], [qwen_images[1]], [qwen_images[2]], [qwen_images[1], qwen_images[0]]):
        expected = transformers_tokens(folder.source, folder.model, images, 16)
        assert genai_tokens(folder.out, images, 16) == expected, [path.name for path in images]
        answers.add(tuple(expected))
    assert len(answers) == 4  # each prompt's images change the answer: the runtime's features are each image's own


def test_qwen2_5_vl_folder_layout(qwen2_5_vl):
    model, out = qwen2_5_vl.model, qwen2_5_vl.out
    assert "task image-text-to-text (the default for Qwen2_5_VLForConditionalGeneration" in qwen2_5_vl.printed
    config = json.loads((out / "genai_config.json").read_text())["model"]
    assert config["type"] == "qwen2_5_vl" and config["image_token_id"] == model.config.image_token_id
    assert config["decoder"]["inputs"]["inputs_embeds"] == "inputs_embeds" and "input_ids" not in config["decoder"]["inputs"]
    assert config["embedding"]["inputs"] == {"input_ids": "input_ids", "image_features": "image_features"}
    assert config["vision"]["config_filename"] == "genai_processor_config.json"
    files = {part: config[part]["filename"] for part in ("vision", "embedding", "decoder")}
    assert files == {"vision": "onnx/vision_encoder.onnx", "embedding": "onnx/embed_tokens.onnx",
                     "decoder": "onnx/decoder_model_merged.onnx"}
    io_names, graphs = {}, {}
    for part, name in files.items():
        onnx.checker.check_model(str(out / name), full_check=True)
        graphs[part] = onnx.load(str(out / name), load_external_data=False).graph
        io_names[part] = ([v.name for v in graphs[part].input], [v.name for v in graphs[part].output])
    assert io_names["vision"] == (["pixel_values", "image_grid_thw"], ["image_features"])
    # any number of patches and of images' grids (the runtime runs the model per image, Transformers.js per prompt)
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in graphs["vision"].input}
    assert isinstance(dims["pixel_values"][0], str) and dims["pixel_values"][1] == 3 * 2 * 14 * 14
    assert isinstance(dims["image_grid_thw"][0], str) and dims["image_grid_thw"][1] == 3
    assert io_names["embedding"] == (["input_ids", "image_features"], ["inputs_embeds"])
    assert io_names["decoder"][0][:3] == ["inputs_embeds", "attention_mask", "position_ids"]
    assert io_names["decoder"][1] == ["logits", "present.0.key", "present.0.value", "present.1.key", "present.1.value"]
    # the cache is appended in place by GroupQueryAttention, as for the causal LMs
    assert json.loads((out / "genai_config.json").read_text())["search"]["past_present_share_buffer"] is True
    processor = json.loads((out / "genai_processor_config.json").read_text())["processor"]["transforms"]
    resize = next(t["operation"]["attrs"] for t in processor if t["operation"]["type"] == "Resize")
    assert resize == {"smart_resize": 1, "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 64, "keep_aspect_ratio": 0,
                      "interpolation": "CUBIC", "patch_size": 14, "merge_size": 2}

    # the verification sees an error planted in the decoder's logits
    assert plant_error(out / files["decoder"], 1e-2) == ["logits"]
    image_processor = transformers.AutoImageProcessor.from_pretrained(qwen2_5_vl.source)
    paths = {part: out / name for part, name in files.items()}
    planted = verify_image_text_to_text(paths, model, image_processor, 4, tolerance_for(torch.float32), ARCHITECTURES["qwen2_5_vl"])
    assert not planted.passed and planted.max_logit_difference == pytest.approx(1e-2, rel=1e-3)


def save_qwen3_vl(folder):
    """A two-layer Qwen3-VL (two vision layers, both feeding DeepStack features to the two
    text layers; interleaved mRoPE) with Qwen's tokenizer and an image processor of patch 16."""
    tokenizer = trained_tokenizer(QWEN_SPECIAL, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_SPECIAL}
    roles = dict(bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    config = transformers.Qwen3VLConfig(
        text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=512, vocab_size=len(tokenizer), **roles,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                          "mrope_interleaved": True}),
        vision_config=dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
                           deepstack_visual_indexes=[0, 1]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3VLForConditionalGeneration(config).eval()
    model.save_pretrained(folder)
    transformers.Qwen2VLImageProcessorPil(patch_size=16, min_pixels=32 * 32, max_pixels=32 * 32 * 64, image_mean=[0.5] * 3,
                                          image_std=[0.5] * 3).save_pretrained(folder)
    tokenizer.chat_template = QWEN_TEMPLATE
    tokenizer.save_pretrained(folder)
    return model


def test_qwen3_vl_folder_carries_the_deepstack_features(qwen3_vl, qwen_images):
    """Qwen3-VL's DeepStack features ride beside the embeddings (the runtime has no input for
    them); they change this model's tokens, and the runtime's equal transformers'
    (test_qwen_folder_generates_as_transformers_on_images_of_every_size)."""
    model, out, source = qwen3_vl.model, qwen3_vl.out, qwen3_vl.source
    config = json.loads((out / "genai_config.json").read_text())["model"]
    assert config["type"] == "qwen3_vl" and config["vision"]["patch_size"] == 16
    # the embeddings and the two DeepStack blocks side by side: the width the runtime sizes both buffers by
    assert config["decoder"]["hidden_size"] == 64 * 3
    files = {part: out / config[part]["filename"] for part in ("vision", "embedding", "decoder")}
    widths = {}
    for part, path in files.items():
        onnx.checker.check_model(str(path), full_check=True)
        graph = onnx.load(str(path), load_external_data=False).graph
        widths[part] = [d.dim_value for d in (graph.output[0] if part != "decoder" else graph.input[0]).type.tensor_type.shape.dim][-1]
    assert widths == {"vision": 192, "embedding": 192, "decoder": 192}
    processor = json.loads((out / "genai_processor_config.json").read_text())["processor"]["transforms"]
    attrs = {t["operation"]["type"]: t["operation"].get("attrs") for t in processor}
    assert attrs["PatchImage"]["patch_size"] == 16
    assert (attrs["Resize"]["min_pixels"], attrs["Resize"]["max_pixels"], attrs["Resize"]["patch_size"]) == (32 * 32, 32 * 32 * 64, 16)

    expected = transformers_tokens(source, model, qwen_images[:1], 16)
    with torch.no_grad():
        kept = [merger.linear_fc2.weight.clone() for merger in model.model.visual.deepstack_merger_list]
        for merger in model.model.visual.deepstack_merger_list:
            merger.linear_fc2.weight.zero_()
        try:
            assert transformers_tokens(source, model, qwen_images[:1], 16) != expected
        finally:
            for merger, weight in zip(model.model.visual.deepstack_merger_list, kept):
                merger.linear_fc2.weight.copy_(weight)


def test_qwen3_vl_in_fake_mode_streams_the_weights(qwen3_vl, tmp_path):
    """Each model reads its own weights from the checkpoint, each written once."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = export_hf(qwen3_vl.source, tmp_path / "fake", fake=True, verify=True)
    assert not [w for w in caught if "does not use" in str(w.message) or "missing" in str(w.message)]
    assert result.verification.passed and result.verification.max_logit_difference < 1e-5, result.verification.summary()
    weights = sum(p.numel() for p in qwen3_vl.model.parameters()) * 4
    written = sum((tmp_path / "fake" / f).stat().st_size for f in result.files if f.endswith("_data"))
    assert weights <= written < weights * 1.05


GEMMA_SPECIAL = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
                 "<image_soft_token>"]
GEMMA_IMAGE_SIZE = (64, 64)  # the processor's fixed size: 16x16 patches of 4, the runtime's 256 tokens per image


def save_gemma3(folder, sliding_window: int = 512, layer_types: list[str] | None = None):
    """A two-layer Gemma 3 (two sliding-window layers unless ``layer_types`` says otherwise;
    two SigLIP layers) with transformers' Gemma 3 processor. The runtime puts
    256 tokens per image (its processor's constant), so mm_tokens_per_image is 256; the
    head is untied and the weights large enough that greedy tokens vary and the image
    tokens' two-way attention changes them."""
    tokenizer = trained_tokenizer(
        GEMMA_SPECIAL, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        extra_special_tokens={"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"},
    )
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in GEMMA_SPECIAL}
    roles = dict(bos_token_id=ids["<bos>"], eos_token_id=ids["<eos>"], pad_token_id=ids["<pad>"])
    config = transformers.Gemma3Config(
        text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=1024, vocab_size=len(tokenizer), sliding_window=sliding_window,
                         layer_types=layer_types, initializer_range=0.3, tie_word_embeddings=False, **roles),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=GEMMA_IMAGE_SIZE[0], patch_size=4, vision_use_head=False),
        mm_tokens_per_image=256, image_token_index=ids["<image_soft_token>"], boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"], tie_word_embeddings=False, **roles,
    )
    torch.manual_seed(5)  # a seed whose tokens a causal prefill changes by the 4th
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # the projector starts at zero: the image would not count
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0, 0.5)
    model.save_pretrained(folder)
    image_processor = transformers.Gemma3ImageProcessorPil(size=dict(zip(("height", "width"), GEMMA_IMAGE_SIZE)))
    transformers.Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_length=256).save_pretrained(folder)
    return model


def gemma_prompt(images: int) -> str:
    return f"<bos><start_of_turn>user\n{'<start_of_image>' * images}describe this image<end_of_turn>\n<start_of_turn>model\n"


def gemma_transformers_tokens(folder, model, image_paths, new_tokens: int, two_way: bool = True) -> list[int]:
    """`model.generate` on transformers' Gemma 3 processor's outputs; ``two_way=False``
    drops `token_type_ids`: image tokens then attend causally."""
    images = [Image.open(path) for path in image_paths]
    inputs = transformers.AutoProcessor.from_pretrained(folder)(text=gemma_prompt(len(images)), images=images, return_tensors="pt")
    if not two_way:
        del inputs["token_type_ids"]
    with torch.no_grad():
        generated = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False)
    return generated[0, inputs["input_ids"].shape[1]:].tolist()


# a window longer than the sequence (281 prompt tokens), then one that cuts it beside a
# full-attention layer: the decoder's cache grows in every layer and the window is a part
# of its mask (of the kernel's attention bias in text steps)
@pytest.mark.parametrize("window", [512, 32])
def test_gemma3_folder_generates_as_transformers(tmp_path, capsys, window):
    model = save_gemma3(tmp_path / "source", window, None if window == 512 else ["sliding_attention", "full_attention"])
    image_paths = [tmp_path / "image.png", tmp_path / "image2.png"]
    for seed, path in enumerate(image_paths):
        Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*GEMMA_IMAGE_SIZE, 3), dtype=np.uint8)).save(path)
    out = tmp_path / "out"
    assert main(["export-hf", str(tmp_path / "source"), "--output", str(out), "--verify"]) == 0
    printed = capsys.readouterr().out
    assert "vision model for 64x64 images" in printed
    # --verify chains the three models in onnxruntime against model.generate with token_type_ids
    assert re.search(r"verification: largest difference \S+ \(within the tolerance .*\), greedy tokens equal", printed)

    config = json.loads((out / "genai_config.json").read_text())["model"]
    assert config["type"] == "gemma3" and config["image_token_id"] == model.config.image_token_id
    # the decoder takes the step's ids to find the image tokens that attend each other both ways
    assert config["decoder"]["inputs"]["input_ids"] == "input_ids"
    assert config["vision"]["inputs"] == {"pixel_values": "pixel_values"}
    files = {part: config[part]["filename"] for part in ("vision", "embedding", "decoder")}
    io = {}
    for part, name in files.items():
        onnx.checker.check_model(str(out / name), full_check=True)
        graph = onnx.load(str(out / name), load_external_data=False).graph
        io[part] = ([v.name for v in graph.input], [v.name for v in graph.output])
    assert io["vision"] == (["pixel_values"], ["image_features"])
    assert io["embedding"] == (["input_ids", "image_features"], ["inputs_embeds"])
    vision = onnx.load(str(out / files["vision"]), load_external_data=False).graph
    assert [d.dim_value for d in vision.output[0].type.tensor_type.shape.dim][1:] == [256, 64]  # [images, tokens, hidden]
    assert io["decoder"][0] == ["input_ids", "inputs_embeds", "attention_mask", "position_ids", "past_key_values.0.key",
                                "past_key_values.0.value", "past_key_values.1.key", "past_key_values.1.value"]
    processor = json.loads((out / "genai_processor_config.json").read_text())["processor"]
    assert processor["name"] == "gemma_3_image_processing"
    resize = next(t["operation"]["attrs"] for t in processor["transforms"] if t["operation"]["type"] == "Resize")
    assert (resize["height"], resize["width"], resize["interpolation"]) == (64, 64, "LINEAR")

    source = tmp_path / "source"
    expected = gemma_transformers_tokens(source, model, image_paths[:1], 16)
    assert len(set(expected)) > 4
    if window == 512:  # the image tokens' two-way attention changes this model's tokens: the runtime's match it
        assert gemma_transformers_tokens(source, model, image_paths[:1], 16, two_way=False) != expected
    assert genai_tokens(out, image_paths[:1], 16, gemma_prompt(1)) == expected
    # two images: the vision model runs on both at once, each image's tokens a block of its own
    assert genai_tokens(out, image_paths, 16, gemma_prompt(2), 1024) == gemma_transformers_tokens(source, model, image_paths, 16)
    # text steps through the fused kernel, steps with image tokens through the model's masks
    decoder = onnx.load(str(out / files["decoder"]), load_external_data=False).graph
    step = next(node for node in decoder.node if node.op_type == "If")
    branches = {a.name: op_types(a.g) for a in step.attribute}
    assert "GroupQueryAttention" in branches["then_branch"] and "GroupQueryAttention" not in branches["else_branch"]
    # the text step as fused as a decoder the kernel's rule makes: every norm (six a layer,
    # the last) one node, no transposes of heads, the kernels rotating query and key themselves
    text_step = next(a.g for a in step.attribute if a.name == "then_branch")
    top = [node.op_type for node in text_step.node]
    norms = top.count("RMSNormalization") + top.count("SkipSimplifiedLayerNormalization")
    assert norms == 6 * model.config.text_config.num_hidden_layers + 1
    assert not {"Transpose", "ReduceMean", "Pow", "Sqrt", "RotaryEmbedding"} & set(top)
    assert kernels_rotating(text_step) == [True] * model.config.text_config.num_hidden_layers
    # both branches update the runtime's one buffer for past and present (the runs above used it)
    assert json.loads((out / "genai_config.json").read_text())["search"]["past_present_share_buffer"] is True
    text_steps_match_transformers(out / files["decoder"], model, window)


def text_steps_match_transformers(path, model, window: int) -> None:
    """The decoder in onnxruntime on text only, a batch of two, one left-padded: a prompt
    longer than the window, then single-token steps, each step's logits against the language
    model's on the whole sequence (no cache), as transformers computes them."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    text_config = model.config.text_config
    rng = np.random.default_rng(0)
    prompt, padding, steps = 40, 7, 3
    ids = rng.integers(10, 200, (2, prompt + steps))
    mask = np.ones_like(ids)
    mask[1, :padding] = 0
    cache = {i.name: np.zeros((2, text_config.num_key_value_heads, 0, text_config.head_dim), np.float32)
             for i in session.get_inputs() if i.name.startswith("past_key_values.")}
    start = 0
    for end in [prompt + s for s in range(steps + 1)]:
        with torch.no_grad():
            embeds = model.model.language_model.embed_tokens(torch.from_numpy(ids[:, :end]))
            positions = torch.from_numpy(np.clip(mask[:, :end].cumsum(-1) - 1, 0, None))
            hidden = model.model.language_model(inputs_embeds=embeds, attention_mask=torch.from_numpy(mask[:, :end]),
                                                position_ids=positions, use_cache=False).last_hidden_state
            expected = model.lm_head(hidden)[:, start:end]
        feed = {"input_ids": ids[:, start:end], "inputs_embeds": embeds[:, start:end].numpy(), "attention_mask": mask[:, :end],
                "position_ids": positions[:, start:end].numpy(), **cache}
        outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
        held = torch.from_numpy(mask[:, start:end]).bool()  # a padded position's logits are no one's
        torch.testing.assert_close(torch.from_numpy(outputs["logits"])[held], expected[held], rtol=1e-3, atol=1e-4)
        cache = {name: outputs[name.replace("past_key_values.", "present.")] for name in cache}
        start = end


def kernels_rotating(graph) -> list[bool]:
    """For each attention kernel of ``graph`` and of its guards' first branches (the kernel
    run as it is), whether it rotates its query and key itself (``do_rotary``)."""
    found = []
    for node in graph.node:
        if node.op_type == "GroupQueryAttention":
            found.append(any(a.name == "do_rotary" and a.i == 1 for a in node.attribute))
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH and attribute.name == "then_branch":
                found += kernels_rotating(attribute.g)
    return found


def op_types(graph) -> set[str]:
    """The op types of ``graph`` and of its nodes' subgraphs."""
    found = set()
    for node in graph.node:
        found.add(node.op_type)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                found |= op_types(attribute.g)
    return found


def test_qwen2_5_vl_in_fake_mode_streams_the_weights_by_the_checkpoints_names(tmp_path):
    """The checkpoint keeps Qwen2.5-VL's legacy names (`model.layers.*`, `visual.*`); the
    three models read their weights by them, each only its own."""
    model = save_qwen2_5_vl(tmp_path / "source")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = export_hf(tmp_path / "source", tmp_path / "out", fake=True, verify=True)
    assert not [w for w in caught if "does not use" in str(w.message) or "missing" in str(w.message)]
    assert result.verification.passed, result.verification.summary()
    assert result.verification.max_logit_difference < 1e-5
    weights = sum(p.numel() for p in model.parameters()) * 4
    written = sum((tmp_path / "out" / f).stat().st_size for f in result.files if f.endswith("_data"))
    assert weights <= written < weights * 1.05  # every weight written once, in the one model that uses it


def test_gemma3_in_fake_mode_streams_the_weights(tmp_path):
    """A fake-mode Gemma 3 (SigLIP's truncated-normal init cannot run on fake weights: it is
    skipped) writes each weight once, in the model that uses it, and generates as transformers."""
    model = save_gemma3(tmp_path / "source")
    image_path = tmp_path / "image.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (*GEMMA_IMAGE_SIZE, 3), dtype=np.uint8)).save(image_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = export_hf(tmp_path / "source", tmp_path / "out", fake=True, verify=True)
    assert not [w for w in caught if "does not use" in str(w.message) or "missing" in str(w.message)]
    assert result.verification.passed and result.verification.max_logit_difference < 1e-4, result.verification.summary()
    weights = sum(p.numel() for p in model.parameters()) * 4
    written = sum((tmp_path / "out" / f).stat().st_size for f in result.files if f.endswith("_data"))
    # the text steps' kernels rotate from tables computed at export, written beside the weights
    decoder = onnx.load(str(tmp_path / "out" / "onnx" / "decoder_model_merged.onnx"), load_external_data=False).graph
    tables = [t for t in decoder.initializer if t.name.startswith(("rotary_cos_cache", "rotary_sin_cache"))]
    assert {t.dims[0] for t in tables} == {1024}  # as many rows as the text model's context, no more
    tables_bytes = sum(int(np.prod(t.dims)) * 4 for t in tables)
    assert tables_bytes > 0 and weights <= written - tables_bytes < weights * 1.05
    expected = gemma_transformers_tokens(tmp_path / "source", model, [image_path], 16)
    assert genai_tokens(tmp_path / "out", [image_path], 16, gemma_prompt(1)) == expected
    config = json.loads((tmp_path / "source" / "config.json").read_text())
    (tmp_path / "source" / "config.json").write_text(json.dumps({**config, "mm_tokens_per_image": 64}))
    with pytest.raises(NotImplementedError, match="puts 64 tokens per image .* always puts 256"):
        export_hf(tmp_path / "source", tmp_path / "out2")
    assert not (tmp_path / "out2").exists()


def test_an_architecture_for_a_task_export_hf_does_not_serve_is_an_error(tmp_path, capsys):
    config = transformers.VivitConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                      image_size=32, num_frames=4, tubelet_size=[2, 16, 16])
    transformers.VivitForVideoClassification(config).save_pretrained(tmp_path / "source")
    with pytest.raises(UnsupportedTaskError) as error:
        export_hf(tmp_path / "source", tmp_path / "out")
    message = str(error.value)
    assert "VivitForVideoClassification" in message and "video-classification" in message
    assert "image-text-to-text" in message and "text-generation" in message and "Nothing was written" in message
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if ".partial-" in p.name]
    assert main(["export-hf", str(tmp_path / "source"), "--output", str(tmp_path / "out"), "--quiet"]) == 1
    assert "UnsupportedTaskError" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_an_image_text_to_text_type_without_a_runtime_layout_is_an_error(tmp_path):
    config = transformers.LlavaConfig(
        vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, image_size=28, patch_size=14),
        text_config=dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         vocab_size=100),
        image_token_id=99,
    )
    transformers.LlavaForConditionalGeneration(config).save_pretrained(tmp_path / "source")
    with pytest.raises(NotImplementedError, match=f"for model types {', '.join(ARCHITECTURES)}; llava is not one of them. Nothing was written. Give --text-only") as error:
        export_hf(tmp_path / "source", tmp_path / "out", say=print)
    assert str(error.value).endswith("`fx2onnx export-hf <model> --output <folder> --runtime standard` writes its folder for Transformers.js 4.3.2.")
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if ".partial-" in p.name]
