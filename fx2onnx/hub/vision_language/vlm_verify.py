"""`export_hf(..., verify=True)` for an image-text-to-text folder: its three models run
in onnxruntime as ONNX Runtime GenAI chains them (vision -> embedding -> decoder, then
one token per step with no image features) on the inputs transformers' image processor
gives for random images, against `model.generate` on the same inputs. Qwen's prompt has
two images of different sizes, neither a multiple of the merged patch, and the vision
model runs once per image as the runtime runs it; Gemma 3's has one image of its
processor's size. The image features and each step's logits are judged by the tolerance,
and the greedy tokens must be equal. Qwen's 3-D mRoPE positions are the model's own
(`get_rope_index`), as the runtime computes them; Gemma 3's decoder is given the step's
ids (its image tokens' two-way attention) and transformers its `token_type_ids`. Mistral 3's
prompt has two images of different sizes whose sides are multiples of the merged patch (the
sizes both processors keep), each run through the vision model at its own size."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fx2onnx.hub.vision_language import vlm_gemma3

from fx2onnx.hub.vision_language import vlm_mistral3
from fx2onnx.hub.shared.verification import Tolerance, Verification, verdict_of, empty_cache, run_session, cpu_session


@dataclasses.dataclass
class _Prompt:
    """A prompt with its images as both sides take them."""

    ids: torch.Tensor
    generate_inputs: dict[str, torch.Tensor]  # model.generate's image inputs beside input_ids
    features: torch.Tensor  # transformers' image features, shaped as the vision model gives them
    positions: np.ndarray  # the prompt's position_ids
    next_position: Callable[[int], np.ndarray]  # position_ids of the token at an index after the prompt


def _text(config: Any, special: set[int]) -> list[int]:
    vocab = int(config.text_config.vocab_size)
    return [t for t in torch.randint(0, vocab, (12,), generator=torch.Generator().manual_seed(1)).tolist() if t not in special]


def _qwen_prompt(model: torch.nn.Module, images: dict[str, torch.Tensor]) -> _Prompt:
    """Each image's placeholder tokens between a few random text tokens, with the mRoPE positions."""
    config = model.config
    text = _text(config, {int(config.image_token_id), int(config.video_token_id), int(config.vision_start_token_id)})
    placeholders = []
    for grid in images["image_grid_thw"]:
        tokens = int(grid.prod()) // int(config.vision_config.spatial_merge_size) ** 2
        placeholders += [int(config.vision_start_token_id), *[int(config.image_token_id)] * tokens, int(config.vision_end_token_id)]
    ids = torch.tensor([text[:3] + placeholders + text[3:8]])
    mm_types = (ids == config.image_token_id).long()
    output = model.model.get_image_features(images["pixel_values"], images["image_grid_thw"])
    features = torch.cat(list(getattr(output, "pooler_output", output)))
    # Qwen3-VL: the DeepStack features beside the merger's, as its vision model gives them (vlm_qwen3.py)
    deepstack = [torch.cat(list(blocks)) for blocks in getattr(output, "deepstack_features", None) or []]
    features = torch.cat([features, *deepstack], dim=-1)
    positions, deltas = model.model.get_rope_index(ids, mm_types, image_grid_thw=images["image_grid_thw"],
                                                   attention_mask=torch.ones_like(ids))
    # a text token after the prompt: its position plus the prompt's mRoPE offset, on all 3 axes
    return _Prompt(ids, {"pixel_values": images["pixel_values"], "image_grid_thw": images["image_grid_thw"],
                         "mm_token_type_ids": mm_types}, features, positions.numpy(),
                   lambda index: np.full((3, 1, 1), index + int(deltas[0]), dtype=np.int64))


def _gemma3_prompt(model: torch.nn.Module, images: dict[str, torch.Tensor]) -> _Prompt:
    """The image's tokens (begin, `mm_tokens_per_image` image tokens, end) between random text tokens."""
    config = model.config
    text = _text(config, {int(config.image_token_id), int(config.boi_token_id), int(config.eoi_token_id)})
    image = [int(config.boi_token_id), *[int(config.image_token_id)] * int(config.mm_tokens_per_image), int(config.eoi_token_id)]
    ids = torch.tensor([text[:3] + image + text[3:8]])
    features = model.model.get_image_features(images["pixel_values"]).pooler_output
    return _Prompt(ids, {"pixel_values": images["pixel_values"], "token_type_ids": (ids == config.image_token_id).long()},
                   features, np.arange(ids.shape[1], dtype=np.int64)[None],
                   lambda index: np.array([[index]], dtype=np.int64))


def _mistral3_prompt(model: torch.nn.Module, images: dict[str, torch.Tensor]) -> _Prompt:
    """Each image's rows of image tokens, each row ended by a break token and the last by
    an end token (Pixtral's layout; the two are text tokens here), between random text tokens."""
    config = model.config
    text = _text(config, {int(config.image_token_id)})
    side = vlm_mistral3.merged_patch(config)
    placeholders = []
    for height, width in images["image_sizes"].tolist():
        rows = [[int(config.image_token_id)] * (width // side) + [text[8]] for _ in range(height // side)]
        rows[-1][-1] = text[9]
        placeholders += [token for row in rows for token in row]
    ids = torch.tensor([text[:3] + placeholders + text[3:8]])
    output = model.model.get_image_features(images["pixel_values"], images["image_sizes"])
    features = torch.cat(list(output.pooler_output))
    return _Prompt(ids, {"pixel_values": images["pixel_values"], "image_sizes": images["image_sizes"]}, features,
                   np.arange(ids.shape[1], dtype=np.int64)[None], lambda index: np.array([[index]], dtype=np.int64))


def _mistral3_sizes(model: torch.nn.Module) -> tuple[tuple[int, int], ...]:
    """Two images of different sizes whose sides are multiples of the merged patch (which
    the runtime's resize and transformers' leave as they are), within the rotary table."""
    side = vlm_mistral3.merged_patch(model.config)
    return (2 * side, 3 * side), (3 * side, side)


def _mistral3_features(vision: Any, images: dict[str, torch.Tensor]) -> np.ndarray:
    """The vision model on each image at its own size (the runtime's loop), concatenated."""
    pixels = images["pixel_values"]
    return np.concatenate([
        run_session(vision, {"pixel_values": pixels[index:index + 1, :, :height, :width].numpy()})["image_features"]
        for index, (height, width) in enumerate(images["image_sizes"].tolist())
    ])


# the (height, width) of Qwen's two random images: neither a multiple of a merged patch (28 or 32 pixels)
QWEN_IMAGE_SIZES = ((50, 90), (100, 44))


def _random_images(sizes) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for size in sizes]


def _image_features(vision: Any, images: dict[str, torch.Tensor]) -> np.ndarray:
    """The vision model's features of each image in turn (the runtime's loop), concatenated."""
    features, start = [], 0
    for grid in images["image_grid_thw"]:
        patches = int(grid.prod())
        feed = {"pixel_values": images["pixel_values"][start:start + patches].numpy(), "image_grid_thw": grid[None].numpy()}
        features.append(run_session(vision, feed)["image_features"])
        start += patches
    return np.concatenate(features)


def verify_image_text_to_text(
    files: dict[str, Path], model: torch.nn.Module, image_processor: Any, new_tokens: int, tolerance: Tolerance,
) -> Verification:
    """Greedy generation with the folder's ``files`` (vision, embedding, decoder) against ``model``."""
    config = model.config
    gemma, mistral = config.model_type == "gemma3", config.model_type == "mistral3"
    sizes = (vlm_gemma3.image_size(image_processor),) if gemma else _mistral3_sizes(model) if mistral else QWEN_IMAGE_SIZES
    images = image_processor(images=_random_images(sizes), return_tensors="pt")
    with torch.no_grad():
        prompt = (_gemma3_prompt if gemma else _mistral3_prompt if mistral else _qwen_prompt)(model, images)
        ids = prompt.ids
        generated = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), **prompt.generate_inputs, max_new_tokens=new_tokens,
            min_new_tokens=new_tokens, do_sample=False, output_logits=True, return_dict_in_generate=True,
            pad_token_id=getattr(config, "pad_token_id", None) or 0,
        )
    tokens, logits_seen = ids[0].tolist(), []
    with cpu_session(files["vision"]) as vision, cpu_session(files["embedding"]) as embedding, cpu_session(files["decoder"]) as decoder:
        if gemma:
            features = run_session(vision, {k: v.numpy() for k, v in images.items()})["image_features"]
        elif mistral:
            features = _mistral3_features(vision, images)
        else:
            features = _image_features(vision, images)
        cache = empty_cache(decoder)
        step_ids, step_features, step_positions = ids.numpy(), features, prompt.positions
        for _ in range(new_tokens):
            embeds = run_session(embedding, {"input_ids": step_ids, "image_features": step_features})["inputs_embeds"]
            feed = {"input_ids": step_ids, "inputs_embeds": embeds, "attention_mask": np.ones((1, len(tokens)), dtype=np.int64),
                    "position_ids": step_positions, **cache}
            outputs = run_session(decoder, feed)
            logits_seen.append(outputs["logits"][:, -1, :])
            tokens.append(int(logits_seen[-1].argmax(-1)[0]))
            cache = {n: outputs[n.replace("past_key_values.", "present.")] for n in cache}
            step_ids, step_features = np.array([[tokens[-1]]], dtype=np.int64), features[:0]
            step_positions = prompt.next_position(len(tokens) - 1)
    onnx_tokens, torch_tokens = tokens[ids.shape[1]:], generated.sequences[0, ids.shape[1]:].tolist()
    pairs = [(features, prompt.features), *zip(logits_seen, generated.logits)]
    return verdict_of(pairs, tolerance, onnx_tokens == torch_tokens, onnx_tokens, torch_tokens)
