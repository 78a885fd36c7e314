"""`export_hf(..., verify=True)` for an image-text-to-text folder: its three models run
in onnxruntime as ONNX Runtime GenAI chains them (vision -> embedding -> decoder, then
one token per step with no image features) on the inputs transformers' image processor
gives for a random image of the export's size, against `model.generate` on the same
inputs. The image features and each step's logits are judged by the tolerance, and the
greedy tokens must be equal. The 3-D mRoPE positions are the model's own
(`get_rope_index`), as the runtime computes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from fx2onnx.hub.verify import Tolerance, Verification, _compared, _empty_cache, _run, _session


def _prompt(config: Any, image_tokens: int, vocab: int) -> torch.Tensor:
    """A prompt with the image's placeholder tokens between a few random text tokens."""
    special = {int(config.image_token_id), int(config.video_token_id), int(config.vision_start_token_id)}
    text = [t for t in torch.randint(0, vocab, (12,), generator=torch.Generator().manual_seed(1)).tolist() if t not in special]
    image = [int(config.vision_start_token_id), *[int(config.image_token_id)] * image_tokens, int(config.vision_end_token_id)]
    return torch.tensor([text[:3] + image + text[3:8]])


def verify_image_text_to_text(
    files: dict[str, Path], model: torch.nn.Module, image_processor: Any, size: tuple[int, int], new_tokens: int,
    tolerance: Tolerance,
) -> Verification:
    """Greedy generation with the folder's ``files`` (vision, embedding, decoder) against ``model``."""
    config = model.config
    pixels = np.random.default_rng(0).integers(0, 256, (*size, 3), dtype=np.uint8)
    images = image_processor(images=[pixels], return_tensors="pt")
    merge = int(config.vision_config.spatial_merge_size)
    ids = _prompt(config, int(images["image_grid_thw"].prod()) // merge**2, int(config.text_config.vocab_size))
    mm_types = (ids == config.image_token_id).long()
    mask = torch.ones_like(ids)
    with torch.no_grad():
        expected_features = model.model.get_image_features(images["pixel_values"], images["image_grid_thw"])
        expected_features = torch.cat(list(getattr(expected_features, "pooler_output", expected_features)))
        generated = model.generate(
            input_ids=ids, attention_mask=mask, pixel_values=images["pixel_values"], image_grid_thw=images["image_grid_thw"],
            mm_token_type_ids=mm_types, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
            output_logits=True, return_dict_in_generate=True, pad_token_id=getattr(config, "pad_token_id", None) or 0,
        )
        positions, deltas = model.model.get_rope_index(ids, mm_types, image_grid_thw=images["image_grid_thw"], attention_mask=mask)
    tokens, logits_seen = ids[0].tolist(), []
    with _session(files["vision"]) as vision, _session(files["embedding"]) as embedding, _session(files["decoder"]) as decoder:
        features = _run(vision, {k: v.numpy() for k, v in images.items()})["image_features"]
        cache = _empty_cache(decoder)
        step_ids, step_features, step_positions = ids.numpy(), features, positions.numpy()
        for _ in range(new_tokens):
            embeds = _run(embedding, {"input_ids": step_ids, "image_features": step_features})["inputs_embeds"]
            feed = {"inputs_embeds": embeds, "attention_mask": np.ones((1, len(tokens)), dtype=np.int64),
                    "position_ids": step_positions, **cache}
            outputs = _run(decoder, feed)
            logits_seen.append(outputs["logits"][:, -1, :])
            tokens.append(int(logits_seen[-1].argmax(-1)[0]))
            cache = {n: outputs[n.replace("past_key_values.", "present.")] for n in cache}
            step_ids, step_features = np.array([[tokens[-1]]], dtype=np.int64), features[:0]
            # a text token after the prompt: its position plus the prompt's mRoPE offset, on all 3 axes
            step_positions = np.full((3, 1, 1), len(tokens) - 1 + int(deltas[0]), dtype=np.int64)
    onnx_tokens, torch_tokens = tokens[ids.shape[1]:], generated.sequences[0, ids.shape[1]:].tolist()
    pairs = [(features, expected_features), *zip(logits_seen, generated.logits)]
    return _compared(pairs, tolerance, onnx_tokens == torch_tokens, onnx_tokens, torch_tokens)
