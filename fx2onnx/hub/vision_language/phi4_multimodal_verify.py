"""`export_hf(..., verify=True)` for a Phi-4-multimodal folder: its vision, speech (when
written), embedding and decoder models chained in onnxruntime as ONNX Runtime GenAI chains
them, on two images' processed inputs (one of 1 x 2 crops whose last columns are padding,
one of a single crop) and two audio clips' (one padded) in one prompt, against
`model.generate` on the same inputs. The processed inputs
are made here (transformers' image processor needs torchvision); the image features and
each step's logits are judged by the tolerance, and the greedy tokens must be equal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fx2onnx.hub.shared.verification import (
    Tolerance, Verification, cpu_session, empty_cache, greedy_decode, run_session, verdict_of,
)
from fx2onnx.hub.vision_language.phi4_multimodal import (
    AUDIO_TOKEN_ID, IMAGE_TOKEN_ID, Phi4Vision, example_images, image_token_counts,
)
from fx2onnx.hub.vision_language.phi4_speech import Phi4Speech, example_audio

# the runtime's audio_projection_mode for a prompt with images and audio
IMAGES_AND_AUDIO = 3


def verify_phi4mm(files: dict[str, Path], model: torch.nn.Module, new_tokens: int, tolerance: Tolerance) -> Verification:
    """Greedy generation with the folder's ``files`` (vision, embedding, decoder) against ``model``."""
    images = example_images()
    counts = image_token_counts(images["image_attention_mask"], images["image_sizes"])
    text = torch.randint(0, 1000, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    audio = example_audio(int(model.config.audio_config.input_size)) if "speech" in files else None
    sizes = audio["audio_sizes"].tolist() if audio is not None else []
    prompt = text[:3] + [IMAGE_TOKEN_ID] * counts[0] + text[3:6] + [IMAGE_TOKEN_ID] * counts[1] + text[6:9]
    ids = torch.tensor([prompt + sum(([AUDIO_TOKEN_ID] * size + text[9 + i:10 + i] for i, size in enumerate(sizes)), []) + text[11:]])
    audio_inputs = {} if audio is None else {
        "audio_input_features": audio["audio_embeds"], "audio_embed_sizes": audio["audio_sizes"],
        "audio_attention_mask": audio["audio_attention_mask"],
    }
    if audio is not None:
        audio["audio_projection_mode"] = torch.tensor([IMAGES_AND_AUDIO])
    with torch.no_grad():
        expected_features = Phi4Vision(model)(**images)["image_features"]
        expected_audio = Phi4Speech(model)(**audio)["audio_features"] if audio is not None else None
        generated = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), image_pixel_values=images["pixel_values"],
            image_sizes=images["image_sizes"], image_attention_mask=images["image_attention_mask"], **audio_inputs,
            max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, output_logits=True,
            return_dict_in_generate=True, pad_token_id=model.config.pad_token_id or 0,
        )
    hidden = int(model.config.hidden_size)
    with cpu_session(files["vision"]) as vision, cpu_session(files["embedding"]) as embedding, cpu_session(files["decoder"]) as decoder:
        features = run_session(vision, {name: value.numpy() for name, value in images.items()})["image_features"]
        audio_features = np.zeros((0, hidden), dtype=features.dtype)
        if audio is not None:
            with cpu_session(files["speech"]) as speech:
                audio_features = run_session(speech, {name: value.numpy() for name, value in audio.items()})["audio_features"]

        def step_feed(step: np.ndarray, mask: np.ndarray, index: int) -> dict[str, np.ndarray]:
            # the prompt's step takes the image and audio features, a decode step none
            step_features, step_audio = (features, audio_features) if index == 0 else (features[:0], audio_features[:0])
            embeds = run_session(embedding, {"input_ids": step, "image_features": step_features, "audio_features": step_audio})
            start = 0 if index == 0 else mask.shape[1] - 1
            positions = np.arange(start, mask.shape[1], dtype=np.int64)[None]
            return {"inputs_embeds": embeds["inputs_embeds"], "attention_mask": mask, "position_ids": positions}

        greedy = greedy_decode(lambda feed: run_session(decoder, feed), empty_cache(decoder), [ids[0].tolist()], new_tokens,
                               feed=step_feed)
    onnx_tokens, torch_tokens = greedy.tokens[0], generated.sequences[0, ids.shape[1]:].tolist()
    pairs = [(features, expected_features), *zip(greedy.logits, generated.logits)]
    if expected_audio is not None:
        pairs.insert(1, (audio_features, expected_audio))
    return verdict_of(pairs, tolerance, onnx_tokens == torch_tokens, onnx_tokens, torch_tokens)
