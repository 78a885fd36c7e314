"""`export_hf(..., verify=True)` for a Phi-4-multimodal folder: its vision, embedding and
decoder models chained in onnxruntime as ONNX Runtime GenAI chains them, on two images'
processed inputs (one of 1 x 2 crops whose last columns are padding, one of a single
crop) in one prompt, against `model.generate` on the same inputs. The processed inputs
are made here (transformers' image processor needs torchvision); the image features and
each step's logits are judged by the tolerance, and the greedy tokens must be equal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fx2onnx.hub.shared.verification import (
    Tolerance, Verification, cpu_session, empty_cache, greedy_decode, run_session, verdict_of,
)
from fx2onnx.hub.vision_language.phi4_multimodal import IMAGE_TOKEN_ID, Phi4Vision, example_images, image_token_counts


def verify_phi4mm(files: dict[str, Path], model: torch.nn.Module, new_tokens: int, tolerance: Tolerance) -> Verification:
    """Greedy generation with the folder's ``files`` (vision, embedding, decoder) against ``model``."""
    images = example_images()
    counts = image_token_counts(images["image_attention_mask"], images["image_sizes"])
    text = torch.randint(0, 1000, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    ids = torch.tensor([text[:3] + [IMAGE_TOKEN_ID] * counts[0] + text[3:6] + [IMAGE_TOKEN_ID] * counts[1] + text[6:]])
    with torch.no_grad():
        expected_features = Phi4Vision(model)(**images)["image_features"]
        generated = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), image_pixel_values=images["pixel_values"],
            image_sizes=images["image_sizes"], image_attention_mask=images["image_attention_mask"],
            max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, output_logits=True,
            return_dict_in_generate=True, pad_token_id=model.config.pad_token_id or 0,
        )
    hidden = int(model.config.hidden_size)
    with cpu_session(files["vision"]) as vision, cpu_session(files["embedding"]) as embedding, cpu_session(files["decoder"]) as decoder:
        features = run_session(vision, {name: value.numpy() for name, value in images.items()})["image_features"]
        no_audio = np.zeros((0, hidden), dtype=features.dtype)

        def step_feed(step: np.ndarray, mask: np.ndarray, index: int) -> dict[str, np.ndarray]:
            # the prompt's step takes the image features, a decode step none
            step_features = features if index == 0 else features[:0]
            embeds = run_session(embedding, {"input_ids": step, "image_features": step_features, "audio_features": no_audio})
            start = 0 if index == 0 else mask.shape[1] - 1
            positions = np.arange(start, mask.shape[1], dtype=np.int64)[None]
            return {"inputs_embeds": embeds["inputs_embeds"], "attention_mask": mask, "position_ids": positions}

        greedy = greedy_decode(lambda feed: run_session(decoder, feed), empty_cache(decoder), [ids[0].tolist()], new_tokens,
                               feed=step_feed)
    onnx_tokens, torch_tokens = greedy.tokens[0], generated.sequences[0, ids.shape[1]:].tolist()
    pairs = [(features, expected_features), *zip(greedy.logits, generated.logits)]
    return verdict_of(pairs, tolerance, onnx_tokens == torch_tokens, onnx_tokens, torch_tokens)
