"""`export_hf(..., verify=True)` for an audio-text-to-text folder: its three models run in
onnxruntime as Transformers.js chains them (the audio encoder once, its features put into the
audio tokens' rows of the prompt's token embeddings, then the decoder one token per step)
against `model.generate` on the same audio and prompt. The audio encoder's features and each
step's logits are judged by the tolerance, and the greedy tokens must be equal."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import torch

from fx2onnx.hub.audio_language.audio_inputs import audio_inputs
from fx2onnx.hub.audio_language.hooks import PROMPT, AudioHooks
from fx2onnx.hub.audio_language.transformers_js_audio import encoder_input_names
from fx2onnx.hub.shared.verification import (
    Tolerance, Verification, cpu_session, empty_cache, end_tokens, greedy_decode, plain_greedy, run_session, verdict_of,
)
from fx2onnx.hub.vision_language.folder_verification import merged_features

TEXT_TOKENS = 12  # random text tokens around the audio tokens


def verification_prompt(model: torch.nn.Module, hooks: AudioHooks, audio_rows: int) -> torch.Tensor:
    """Random text tokens (none special) with ``audio_rows`` audio tokens after the third."""
    config = model.config
    vocab = int(config.text_config.vocab_size)
    special = {hooks.audio_token_id, *(getattr(config, name, None) for name in ("image_token_id", "pad_token_id"))}
    drawn = torch.randint(0, vocab, (3 * TEXT_TOKENS,), generator=torch.Generator().manual_seed(1)).tolist()
    text = [token for token in drawn if token not in special][:TEXT_TOKENS]
    return torch.tensor([text[:3] + [hooks.audio_token_id] * audio_rows + text[3:]])


def verify_audio_text_to_text(
    files: dict[str, Path], model: torch.nn.Module, hooks: AudioHooks, folder: Path, new_tokens: int, tolerance: Tolerance,
) -> Verification:
    """Greedy generation with the folder's ``files`` (audio, embedding, decoder) against ``model``."""
    config = model.config
    audio = audio_inputs(model, hooks, folder, batch=1, seed=1)
    forward = inspect.signature(model.forward).parameters
    with torch.no_grad():
        expected_features = hooks.features(model, audio)
        ids = verification_prompt(model, hooks, expected_features.shape[0])
        with plain_greedy(model):
            generated = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), **{k: v for k, v in audio.items() if k in forward and k != PROMPT},
                **{k: v for k, v in hooks.fixed.items() if k in forward}, max_new_tokens=new_tokens,
                min_new_tokens=new_tokens, do_sample=False, output_logits=True, return_dict_in_generate=True,
                pad_token_id=getattr(config, "pad_token_id", None) or 0,
            )
    with cpu_session(files["audio"]) as encoder, cpu_session(files["embedding"]) as embedding, \
            cpu_session(files["decoder"]) as decoder:
        names = encoder_input_names(config.model_type)
        features = run_session(encoder, {names.get(k, k): v.numpy() for k, v in audio.items()})["audio_features"]

        def step_feed(step: np.ndarray, mask: np.ndarray, index: int) -> dict[str, np.ndarray]:
            embeds = run_session(embedding, {"input_ids": step})["inputs_embeds"]
            if index == 0:  # the prompt's audio tokens take the features; a generated one keeps its embedding
                embeds = merged_features(step, embeds, features, hooks.audio_token_id)
            positions = np.arange(mask.shape[1] - step.shape[1], mask.shape[1], dtype=np.int64)[None]
            return {"inputs_embeds": embeds, "attention_mask": mask, "position_ids": positions}

        greedy = greedy_decode(lambda feed: run_session(decoder, feed), empty_cache(decoder), [ids[0].tolist()], new_tokens,
                               banned=end_tokens(model), feed=step_feed)
    onnx_tokens, torch_tokens = greedy.tokens[0], generated.sequences[0, ids.shape[1]:].tolist()
    pairs = [(features, expected_features), *zip(greedy.logits, generated.logits)]
    return verdict_of(pairs, tolerance, onnx_tokens == torch_tokens, onnx_tokens, torch_tokens)
