"""Tiny image-text-to-text models of the Qwen3-VL kind (Qwen3-VL, Qwen3-VL-MoE, Qwen3.5,
Qwen3.5-MoE, GLM-OCR), each with Qwen's tokenizer and an image processor, saved for
export-hf; and the processed inputs of a (left-padded) batch of prompts with and without
images, as transformers' processor gives them."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from PIL import Image

from test_export_hf_vision_language import QWEN_IMAGE, QWEN_SPECIAL, QWEN_TEMPLATE, save_qwen3_vl, trained_tokenizer

# GLM-OCR's image placeholder tokens in place of Qwen's vision start and end
GLM_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_image|>", "<|end_of_image|>", "<|image|>",
               "<|video|>", "<|begin_of_video|>", "<|end_of_video|>"]
# two text layers of 64, two vision layers of 32 (patch 16, merge 2: images in merged patches of 32 pixels)
VISION = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64, patch_size=16,
              spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16)
TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=512)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
# Qwen3.5's text model: one linear-attention (gated delta) layer, then one of full attention
LINEAR = dict(layer_types=["linear_attention", "full_attention"], linear_conv_kernel_dim=4, linear_key_head_dim=16,
              linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4)


def _save(folder: Path, config_class, model_class, text: dict, vision: dict, special: list[str], tokens: dict,
          template: str = QWEN_TEMPLATE) -> torch.nn.Module:
    tokenizer = trained_tokenizer(special, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in special}
    roles = dict(bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    config = config_class(
        text_config=dict(**TEXT, vocab_size=len(tokenizer), **roles, **text), vision_config=vision,
        **{name: ids[token] for name, token in tokens.items()}, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = model_class(config).eval()
    model.save_pretrained(folder)
    side = vision["patch_size"] * vision["spatial_merge_size"]
    transformers.Qwen2VLImageProcessorPil(patch_size=vision["patch_size"], min_pixels=side * side, max_pixels=side * side * 64,
                                          image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(folder)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(folder)
    return model


QWEN_TOKENS = dict(image_token_id="<|image_pad|>", video_token_id="<|video_pad|>", vision_start_token_id="<|vision_start|>",
                   vision_end_token_id="<|vision_end|>")
INTERLEAVED = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                   "mrope_interleaved": True}}


def save_qwen3_vl_moe(folder: Path) -> torch.nn.Module:
    return _save(folder, transformers.Qwen3VLMoeConfig, transformers.Qwen3VLMoeForConditionalGeneration,
                 {**MOE, **INTERLEAVED}, {**VISION, "deepstack_visual_indexes": [0, 1]}, QWEN_SPECIAL, QWEN_TOKENS)


GLM_IMAGE = "<|begin_of_image|><|image|><|end_of_image|>"  # one image's placeholder in GLM-OCR's prompts
GLM_TOKENS = dict(image_token_id="<|image|>", video_token_id="<|video|>", image_start_token_id="<|begin_of_image|>",
                  image_end_token_id="<|end_of_image|>", video_start_token_id="<|begin_of_video|>",
                  video_end_token_id="<|end_of_video|>")


def save_glm_ocr(folder: Path) -> torch.nn.Module:
    """A two-layer GLM-OCR (patch 14, merge 2: merged patches of 28 pixels) with mRoPE sections."""
    vision = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2)
    text = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}}
    return _save(folder, transformers.GlmOcrConfig, transformers.GlmOcrForConditionalGeneration, text, vision, GLM_SPECIAL,
                 GLM_TOKENS, QWEN_TEMPLATE.replace(QWEN_IMAGE, GLM_IMAGE))


def save_qwen3_5(folder: Path) -> torch.nn.Module:
    return _save(folder, transformers.Qwen3_5Config, transformers.Qwen3_5ForConditionalGeneration, {**LINEAR, **INTERLEAVED},
                 VISION, QWEN_SPECIAL, QWEN_TOKENS)


def save_qwen3_5_moe(folder: Path) -> torch.nn.Module:
    return _save(folder, transformers.Qwen3_5MoeConfig, transformers.Qwen3_5MoeForConditionalGeneration,
                 {**LINEAR, **INTERLEAVED, **MOE, "shared_expert_intermediate_size": 32}, VISION, QWEN_SPECIAL, QWEN_TOKENS)


SAVERS = {"qwen3_vl": save_qwen3_vl, "qwen3_vl_moe": save_qwen3_vl_moe, "glm_ocr": save_glm_ocr, "qwen3_5": save_qwen3_5,
          "qwen3_5_moe": save_qwen3_5_moe}
# a prompt's text around its images, and one image's placeholder (its image token repeated as the grid needs)
PROMPTS = {"qwen3_vl": ("<|im_start|>user\n{images}{question}<|im_end|>\n<|im_start|>assistant\n", QWEN_IMAGE,
                        "<|image_pad|>")}
PROMPTS["qwen3_vl_moe"] = PROMPTS["qwen3_5"] = PROMPTS["qwen3_5_moe"] = PROMPTS["qwen3_vl"]
PROMPTS["qwen2_vl"] = PROMPTS["qwen2_5_vl"] = PROMPTS["qwen3_vl"]  # Qwen2-VL's and Qwen2.5-VL's, as Qwen3-VL's
PROMPTS["glm_ocr"] = (PROMPTS["qwen3_vl"][0], GLM_IMAGE, "<|image|>")


def processed_batch(folder: Path, family: str, prompts: list[tuple[list[Path], str]], pad_id: int) -> dict[str, torch.Tensor]:
    """transformers' inputs of ``prompts`` (each its image files, maybe none, and its question):
    each image's placeholder expanded to its grid's tokens, the rows left-padded with ``pad_id``."""
    text, placeholder, image_token = PROMPTS[family]
    image_processor = transformers.AutoImageProcessor.from_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    merge = image_processor.merge_size
    rows, pixels, grids = [], [], []
    for paths, question in prompts:
        prompt = text.format(images=placeholder * len(paths), question=question)
        if paths:
            images = image_processor(images=[Image.open(path) for path in paths], return_tensors="pt")
            for grid in images["image_grid_thw"]:  # one image's placeholder at a time, in order
                prompt = prompt.replace(image_token, "<|placeholder|>" * (int(grid.prod()) // merge ** 2), 1)
            pixels.append(images["pixel_values"])
            grids.append(images["image_grid_thw"])
        rows.append(tokenizer(prompt.replace("<|placeholder|>", image_token))["input_ids"])
    width = max(len(row) for row in rows)
    ids = torch.tensor([[pad_id] * (width - len(row)) + row for row in rows])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
    inputs = {"input_ids": ids, "attention_mask": mask}
    if pixels:
        inputs.update(pixel_values=torch.cat(pixels), image_grid_thw=torch.cat(grids))
    return inputs
