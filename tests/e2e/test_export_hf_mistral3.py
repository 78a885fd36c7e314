"""Mistral 3 (Pixtral's vision tower) as ONNX Runtime GenAI's `mistral3` type: the folder
generates what transformers generates with its own image processor on the original images
(the prompt expanded as PixtralProcessor does, which needs torchvision), images of several
sizes and aspect ratios and two in one prompt."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from fx2onnx.hub import export_hf
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
Image = pytest.importorskip("PIL.Image")
from test_export_hf_vision_language import genai_tokens, trained_tokenizer  # noqa: E402

SPECIAL = ["<s>", "</s>", "<unk>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"]
LONGEST_EDGE = 224
# (height, width): sides that are multiples of the merged patch (28), which the runtime's
# resize and transformers' keep; three aspect ratios. Two images in one prompt: the first
# as tall and as wide as the second (onnxruntime-genai 0.18 stacks the images in a tensor
# of a wrong shape otherwise, and its vision loop refuses it)
IMAGE_SIZES = [(56, 84), (112, 28), (84, 84)]


def prompt(images: int) -> str:
    """Each image's [IMG] apart: the runtime takes consecutive [IMG] tokens for one image's placeholder."""
    return f"[INST]{' and '.join(['[IMG]'] * images)}describe this image[/INST]"


def pixtral_parts(text_type: str) -> tuple:
    """What a tiny model of Pixtral's vision tower shares (Mistral 3, LightOnOCR): the
    tokenizer with its special tokens, the config's entries (two Pixtral vision layers, a
    two-layer ``text_type`` text model of the tokenizer's vocabulary, the token roles, the
    image token, merges of 2 x 2 patches)."""
    tokenizer = trained_tokenizer(SPECIAL, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL}
    roles = dict(bos_token_id=ids["<s>"], eos_token_id=ids["</s>"], pad_token_id=ids["<unk>"])
    entries = dict(
        vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, head_dim=16, image_size=LONGEST_EDGE, patch_size=14),
        text_config=dict(model_type=text_type, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=len(tokenizer), **roles),
        image_token_id=ids["[IMG]"], spatial_merge_size=2, **roles,
    )
    return tokenizer, entries


def save_mistral3(folder):
    """A two-layer Mistral 3 (two Pixtral vision layers) with its tokenizer and processor."""
    tokenizer, entries = pixtral_parts("mistral")
    entries["text_config"]["sliding_window"] = None
    config = transformers.Mistral3Config(**entries)
    torch.manual_seed(0)
    model = transformers.Mistral3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # weights large enough that the tokens depend on the image (at the default init they do not)
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, 0.3)
    model.save_pretrained(folder)
    image_processor = transformers.PixtralImageProcessorPil(patch_size={"height": 28, "width": 28},
                                                            size={"longest_edge": LONGEST_EDGE})
    image_processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, (image_processor, tokenizer)


def transformers_tokens(model, processor, image_paths, new_tokens: int) -> list[int]:
    """Greedy tokens of `model.generate` on transformers' image processor's inputs for the
    image files as they are, each [IMG] expanded to its image's rows as PixtralProcessor does."""
    image_processor, tokenizer = processor
    images = image_processor(images=[Image.open(path) for path in image_paths], return_tensors="pt")
    text = prompt(len(image_paths))
    for height, width in images["image_sizes"].tolist():  # one image's placeholder at a time, in order
        rows = ["<placeholder>" * (width // 28) + "[IMG_BREAK]"] * (height // 28)
        text = text.replace("[IMG]", "".join(rows)[:-len("[IMG_BREAK]")] + "[IMG_END]", 1)
    ids = tokenizer(text.replace("<placeholder>", "[IMG]"), return_tensors="pt")["input_ids"]
    with torch.no_grad():
        generated = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=images["pixel_values"],
                                   image_sizes=images["image_sizes"], max_new_tokens=new_tokens, do_sample=False)
    return generated[0, ids.shape[1]:].tolist()


@pytest.fixture(scope="module")
def mistral3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mistral3")
    model, processor = save_mistral3(folder / "source")
    result = export_hf(folder / "source", folder / "out", verify=True)
    rng = np.random.default_rng(0)
    paths = []
    for index, (height, width) in enumerate(IMAGE_SIZES):
        paths.append(folder / f"image{index}.png")
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(paths[-1])
    return model, processor, folder / "out", result, paths


def test_the_tiny_model_answers_each_image_otherwise(mistral3):
    model, processor, _, _, paths = mistral3
    answers = {tuple(transformers_tokens(model, processor, [path], 16)) for path in paths}
    assert len(answers) == len(paths)


def test_mistral3_folder_layout(mistral3):
    _, _, out, result, _ = mistral3
    # --verify: the three models chained in onnxruntime, two images of different sizes, 16 tokens equal
    assert result.verification.passed and result.verification.max_logit_difference < 1e-4
    for name in ("vision_encoder", "embed_tokens", "decoder_model_merged"):
        onnx.checker.check_model(str(out / "onnx" / f"{name}.onnx"), full_check=True)
    vision = onnx.load(str(out / "onnx" / "vision_encoder.onnx"), load_external_data=False)
    assert [i.name for i in vision.graph.input] == ["pixel_values"]
    # one image, any height and width
    assert [d.dim_value or d.dim_param[:1] for d in vision.graph.input[0].type.tensor_type.shape.dim][:2] == [1, 3]
    config = json.loads((out / "genai_config.json").read_text())["model"]
    assert config["type"] == "mistral3" and config["vision"]["patch_size"] == 14 and config["vision"]["spatial_merge_size"] == 2
    assert set(config["decoder"]["inputs"]) >= {"inputs_embeds", "position_ids"} and "input_ids" not in config["decoder"]["inputs"]
    transforms = json.loads((out / "genai_processor_config.json").read_text())["processor"]["transforms"]
    assert [t["operation"]["type"] for t in transforms][-2:] == ["Permute3D", "PixtralImageSizes"]


@pytest.mark.parametrize("images", [[0], [1], [2], [2, 0]])
def test_mistral3_folder_generates_as_transformers(mistral3, images):
    model, processor, out, _, paths = mistral3
    chosen = [paths[index] for index in images]
    expected = transformers_tokens(model, processor, chosen, 16)
    assert len(expected) == 16
    assert genai_tokens(out, chosen, 16, prompt(len(chosen))) == expected


def test_mistral3_in_fake_mode_streams_the_weights(mistral3, tmp_path):
    model, _, _, _, _ = mistral3
    assert model.config.tie_word_embeddings  # the LM head reads the embedding the checkpoint holds once
    result = export_hf(mistral3[2].parent / "source", tmp_path / "out", fake=True, verify=True)
    assert result.verification.passed and result.verification.max_logit_difference < 1e-4
