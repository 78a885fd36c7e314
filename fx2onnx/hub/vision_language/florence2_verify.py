"""A Florence-2 folder (florence2.py) run as Transformers.js runs it, in onnxruntime, against
transformers' greedy `generate`: the folder's processor's inputs for two images of other
sizes than the one it resizes to, each with a task prompt of its own, and a task prompt
without an image; the vision model on the pixels, the embedding on the prompt's tokens after
its image tokens (Transformers.js's processor writes none: it puts the features before the
prompt itself), the encoder on both, then the merged decoder from the decoder start token,
each step's ids embedded first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from fx2onnx.hub.shared.verification import (
    Tolerance, Verification, cpu_session, empty_cache, end_tokens, greedy_decode, plain_greedy, run_session, verdict_of,
)

# the images (height, width) and the task prompts verified: captions and detection, whose
# prompts the processor expands to sentences of their own lengths
IMAGES = ((50, 70), (90, 40))
TASKS = ("<CAPTION>", "<OD>")


def random_image(height: int, width: int, seed: int) -> Any:
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def decoder_start(model: torch.nn.Module) -> int:
    """The token generation starts the decoder with (the generation config's, else the text config's)."""
    start = getattr(getattr(model, "generation_config", None), "decoder_start_token_id", None)
    return int(start if start is not None else model.config.text_config.decoder_start_token_id)


def transformers_js_inputs(given: dict[str, torch.Tensor], image_token: int) -> dict[str, np.ndarray]:
    """The processor's inputs as Transformers.js's Florence2Processor gives them: the prompt's
    tokens without the image tokens transformers' processor writes before them."""
    keep = (given["input_ids"] != image_token).numpy()
    rows = keep.sum(axis=1)
    if not (rows == rows[0]).all():
        raise ValueError("every prompt of a batch must have as many image tokens")
    return {"input_ids": given["input_ids"].numpy()[keep].reshape(len(rows), -1),
            "attention_mask": given["attention_mask"].numpy()[keep].reshape(len(rows), -1),
            "pixel_values": given["pixel_values"].numpy()}


def greedy_in_folder(files: dict[str, Path], inputs: dict[str, np.ndarray], start: int, steps: int,
                     banned: list[int], image_token: int | None = None) -> tuple[list[list[int]], list[np.ndarray]]:
    """The folder's greedy tokens and each step's logits for ``inputs``: Transformers.js's
    (the image's features put before the prompt), or, given the ``image_token``,
    transformers' processor's (its image tokens' rows replaced by the features, wherever
    the padding puts them: after a left-padded row's padding)."""
    with cpu_session(files["vision"]) as vision, cpu_session(files["embedding"]) as embedding, \
            cpu_session(files["encoder"]) as encoder, cpu_session(files["decoder"]) as decoder:
        rows = run_session(embedding, {"input_ids": inputs["input_ids"]})["inputs_embeds"]
        mask = inputs["attention_mask"]
        features = run_session(vision, {"pixel_values": inputs["pixel_values"]})["image_features"] if "pixel_values" in inputs else None
        if features is not None and image_token is not None:  # transformers' merge: the image tokens' rows
            places = inputs["input_ids"] == image_token
            if places.sum() != features.shape[0] * features.shape[1]:
                raise ValueError("the prompts' image tokens are not the images' features")
            rows = rows.copy()
            rows[places] = features.reshape(-1, features.shape[-1])
        elif features is not None:  # the image's features before the prompt, attended (Transformers.js's merge)
            rows = np.concatenate([features, rows], axis=1)
            mask = np.concatenate([np.ones(features.shape[:2], dtype=np.int64), mask], axis=1)
        hidden = run_session(encoder, {"inputs_embeds": rows, "attention_mask": mask})["last_hidden_state"]

        def step_feed(step: np.ndarray, _mask: np.ndarray, index: int) -> dict[str, np.ndarray]:
            return {"inputs_embeds": run_session(embedding, {"input_ids": step})["inputs_embeds"],
                    "encoder_hidden_states": hidden, "encoder_attention_mask": mask, "use_cache_branch": np.array([index > 0])}

        batch = rows.shape[0]
        greedy = greedy_decode(lambda feed: run_session(decoder, feed), empty_cache(decoder, batch), [[start]] * batch, steps,
                               banned=banned, feed=step_feed)
    return greedy.tokens, greedy.logits


def _verified(files: dict[str, Path], model: torch.nn.Module, given: dict[str, torch.Tensor], inputs: dict[str, np.ndarray],
              steps: int, tolerance: Tolerance) -> Verification:
    """The folder on ``inputs`` (Transformers.js's) against transformers' generation on ``given``."""
    with torch.no_grad(), plain_greedy(model):
        out = model.generate(**given, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
    torch_tokens = out.sequences[0, 1:].tolist()
    tokens, logits = greedy_in_folder(files, inputs, decoder_start(model), steps, end_tokens(model))
    return verdict_of(zip(logits, out.logits), tolerance, tokens[0] == torch_tokens, tokens[0], torch_tokens)


def verify_florence2(files: dict[str, Path], model: torch.nn.Module, source: Path, steps: int,
                     tolerance: Tolerance) -> Verification:
    """The folder against ``model``'s greedy generation of ``steps`` tokens, for each image and
    task, and the first task's prompt alone (the tokenizer's ids with their special tokens, as
    Transformers.js's processor gives them)."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(source)
    verdicts = []
    for seed, ((height, width), task) in enumerate(zip(IMAGES, TASKS)):
        given = dict(processor(text=task, images=random_image(height, width, seed), return_tensors="pt"))
        inputs = transformers_js_inputs(given, int(model.config.image_token_id))
        verdicts.append(_verified(files, model, given, inputs, steps, tolerance))
    text = dict(processor.tokenizer(processor.task_prompts_without_inputs[TASKS[0]], return_tensors="pt"))
    text = {name: text[name] for name in ("input_ids", "attention_mask")}
    verdicts.append(_verified(files, model, text, {k: v.numpy() for k, v in text.items()}, steps, tolerance))
    return Verification.merged(verdicts)
