"""`export_hf(..., verify=True)` for an image-text-to-text folder: its three models run
in onnxruntime as ONNX Runtime GenAI chains them (vision -> embedding -> decoder, then
one token per step with no image features) on the inputs transformers' image processor
gives for random images, against `model.generate` on the same inputs. The images, the
prompt and the vision model's loop over the images are the architecture's (its row:
architectures.py); Qwen's prompt has two images of different sizes, neither a multiple of
the merged patch, Gemma 3's one image of its processor's size, Mistral 3's two images whose
sides are multiples of the merged patch. The image features and each step's logits are
judged by the tolerance, and the greedy tokens must be equal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from fx2onnx.hub.shared.verification import (
    Tolerance, Verification, cpu_session, empty_cache, end_tokens, greedy_decode, run_session, verdict_of,
)
from fx2onnx.hub.vision_language.architecture import VisionLanguageArchitecture


def random_images(sizes: tuple[tuple[int, int], ...]) -> list[np.ndarray]:
    """RGB images of random pixels, one per (height, width)."""
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for size in sizes]


def merged_features(input_ids: np.ndarray, embeds: np.ndarray, features: np.ndarray, image_token_id: int) -> np.ndarray:
    """``embeds`` with the image tokens' rows replaced by the ``features`` rows in order, as
    Transformers.js merges them for an embedding that takes no images."""
    merged = embeds.copy()
    merged[input_ids == image_token_id] = features
    return merged


def verify_image_text_to_text(
    files: dict[str, Path], model: torch.nn.Module, image_processor: Any, new_tokens: int, tolerance: Tolerance,
    architecture: VisionLanguageArchitecture, embedding_merges: bool = True,
) -> Verification:
    """Greedy generation with the folder's ``files`` (vision, embedding, decoder) of
    ``architecture`` against ``model``; ``embedding_merges``: the embedding takes the image features (ONNX Runtime
    GenAI's), else they are merged here as Transformers.js merges them."""
    config = model.config
    if architecture.verification_images is not None:
        images = architecture.verification_images(model, image_processor)
    else:
        images = image_processor(images=random_images(architecture.verification_sizes(model, image_processor)), return_tensors="pt")
    with torch.no_grad():
        prompt = architecture.verification_prompt(model, images)
        ids = prompt.ids
        generated = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), **prompt.generate_inputs, max_new_tokens=new_tokens,
            min_new_tokens=new_tokens, do_sample=False, output_logits=True, return_dict_in_generate=True,
            pad_token_id=getattr(config, "pad_token_id", None) or 0,
        )
    with cpu_session(files["vision"]) as vision, cpu_session(files["embedding"]) as embedding, cpu_session(files["decoder"]) as decoder:
        features = architecture.image_features(vision, images)

        def step_feed(step: np.ndarray, mask: np.ndarray, index: int) -> dict[str, np.ndarray]:
            # the prompt's step takes the image features and positions; a decode step none, the next position
            step_features = features if index == 0 else features[:0]
            if embedding_merges:
                embedded = run_session(embedding, {"input_ids": step, "image_features": step_features})
            else:
                embedded = run_session(embedding, {"input_ids": step})
                if index == 0:  # a decode step has no images (a generated image token keeps its embedding)
                    embedded["inputs_embeds"] = merged_features(step, embedded["inputs_embeds"], features,
                                                                int(config.image_token_id))
            positions = prompt.positions if index == 0 else prompt.next_position(mask.shape[1] - 1)
            # the embedding's other outputs (Gemma 4's per_layer_inputs) go to the decoder as they are
            return {**embedded, "input_ids": step, "attention_mask": mask, "position_ids": positions}

        # never the end of text while transformers' min_new_tokens keeps generating
        greedy = greedy_decode(lambda feed: run_session(decoder, feed), empty_cache(decoder), [ids[0].tolist()], new_tokens,
                               banned=end_tokens(model), feed=step_feed)
    onnx_tokens, torch_tokens = greedy.tokens[0], generated.sequences[0, ids.shape[1]:].tolist()
    pairs = [(features, prompt.features), *zip(greedy.logits, generated.logits)]
    if architecture.more_pairs is not None:
        pairs += architecture.more_pairs(files, model)
    return verdict_of(pairs, tolerance, onnx_tokens == torch_tokens, onnx_tokens, torch_tokens)
