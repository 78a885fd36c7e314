"""`export_hf(..., verify=True)` for VoxtralRealtime's streaming folder: its three models run
in onnxruntime as Transformers.js's VoxtralRealtimeForConditionalGeneration chains them (the
audio encoder chunk by chunk whenever the tokens so far need more audio, with its padding
cache and key/value cache fed back; each audio embedding added to one token's embedding; the
decoder one token per step) against `model.generate` on the whole clip (transformers' own
unstreamed path: the convolutions over the clip, the encoder a token's frames per step).
Two clips: one exactly as long as the prompt and new tokens need, in chunks of two tokens'
frames, and a longer one in chunks of one token's, so the two runs chunk the audio
differently from each other and from transformers. The audio embeddings and each step's
logits are judged by the tolerance, and the greedy tokens must be equal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from fx2onnx.hub.audio_language.voxtral_realtime import encoder_positions, zero_padding_cache
from fx2onnx.hub.shared.verification import (
    Tolerance, Verification, cpu_session, empty_cache, end_tokens, greedy_decode, plain_greedy, run_session, verdict_of,
)

PROMPT_TOKENS = 4  # the prompt after its first token (the processor's is the start and streaming pad tokens)
EXTRA_TOKENS = 3  # the longer clip's audio beyond what the generation reads
CHUNK_TOKENS = (2, 1)  # tokens' worth of frames per chunk after the first, per clip


def _is_key_value(name: str) -> bool:
    return name.startswith("past_key_values.")


def verification_prompt(model: torch.nn.Module) -> list[int]:
    """The start token then random text tokens (none an end token)."""
    config = model.config.text_config
    ends = set(end_tokens(model)) | {config.bos_token_id, config.pad_token_id}
    drawn = torch.randint(0, int(config.vocab_size), (4 * PROMPT_TOKENS,), generator=torch.Generator().manual_seed(1)).tolist()
    return [int(config.bos_token_id or 1)] + [token for token in drawn if token not in ends][:PROMPT_TOKENS]


class StreamingAudio:
    """The client's audio state: the chunks not yet encoded, the caches, the embeddings not yet added."""

    def __init__(self, encoder: Any, chunks: list[np.ndarray], padding: np.ndarray) -> None:
        self.encoder, self.chunks, self.padding = encoder, list(chunks), padding
        self.cache = empty_cache(encoder, is_cache=_is_key_value)
        self.past, self.embeds, self.consumed = 0, [], 0

    def _encode_next(self) -> None:
        chunk = self.chunks.pop(0)
        new = encoder_positions(chunk.shape[-1])
        outputs = run_session(self.encoder, {
            "input_features": chunk, "attention_mask": np.ones((1, self.past + new), dtype=np.int64),
            "position_ids": np.arange(self.past, self.past + new, dtype=np.int64)[None],
            "past_padding_cache": self.padding, **self.cache,
        })
        self.padding = outputs["present_padding_cache"]
        self.cache = {name: outputs[name.replace("past_key_values", "present")] for name in self.cache}
        self.past += new
        self.embeds.append(outputs["audio_embeds"])

    def add_to(self, embeds: np.ndarray) -> np.ndarray:
        """``embeds`` (the next tokens') plus the next audio embeddings, one for one."""
        needed = self.consumed + embeds.shape[1]
        while sum(part.shape[1] for part in self.embeds) < needed and self.chunks:
            self._encode_next()
        audio = np.concatenate(self.embeds, axis=1)[:, self.consumed:needed]
        embeds = embeds.copy()
        embeds[:, :audio.shape[1]] += audio
        self.consumed = needed
        return embeds

    def all_embeds(self) -> np.ndarray:
        while self.chunks:
            self._encode_next()
        return np.concatenate(self.embeds, axis=1)


def _chunks(features: torch.Tensor, first_tokens: int, tokens_per_chunk: int, per_token: int) -> list[np.ndarray]:
    cuts = [0, first_tokens * per_token]
    while cuts[-1] < features.shape[-1]:
        cuts.append(min(cuts[-1] + tokens_per_chunk * per_token, features.shape[-1]))
    return [features[..., start:end].numpy() for start, end in zip(cuts, cuts[1:])]


def _verify_clip(files: dict[str, Path], model: torch.nn.Module, prompt: list[int], audio_tokens: int, chunk_tokens: int,
                 new_tokens: int, seed: int) -> tuple[list[Any], list[int], list[int]]:
    config = model.config
    per_token = int(config.audio_length_per_tok)
    features = torch.randn(1, int(config.audio_config.num_mel_bins), audio_tokens * per_token,
                           generator=torch.Generator().manual_seed(seed))
    ids = torch.tensor([prompt])
    with torch.no_grad():
        expected_audio = model.model.get_audio_features(input_features=features).pooler_output
        with plain_greedy(model):
            generated = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), input_features=features, max_new_tokens=new_tokens,
                min_new_tokens=new_tokens, do_sample=False, output_logits=True, return_dict_in_generate=True,
                pad_token_id=config.text_config.pad_token_id or 0,
            )
    with cpu_session(files["audio"]) as encoder, cpu_session(files["embedding"]) as embedding, \
            cpu_session(files["decoder"]) as decoder:
        audio = StreamingAudio(encoder, _chunks(features, len(prompt), chunk_tokens, per_token),
                               zero_padding_cache(config).numpy())

        def step_feed(step: np.ndarray, mask: np.ndarray, _index: int) -> dict[str, np.ndarray]:
            embeds = audio.add_to(run_session(embedding, {"input_ids": step})["inputs_embeds"])
            return {"inputs_embeds": embeds, "attention_mask": mask}  # the client feeds no positions

        greedy = greedy_decode(lambda feed: run_session(decoder, feed), empty_cache(decoder), [prompt], new_tokens,
                               banned=end_tokens(model), feed=step_feed)
        streamed_audio = audio.all_embeds()
    pairs = [(streamed_audio, expected_audio), *zip(greedy.logits, generated.logits)]
    return pairs, greedy.tokens[0], generated.sequences[0, len(prompt):].tolist()


def verify_voxtral_realtime(files: dict[str, Path], model: torch.nn.Module, new_tokens: int,
                            tolerance: Tolerance) -> Verification:
    """Greedy generation with the folder's ``files`` (audio, embedding, decoder) against
    ``model`` on two clips; the tokens reported are the first clip's, equal only if both
    clips' are."""
    prompt = verification_prompt(model)
    pairs, onnx_tokens, torch_tokens, equal = [], [], [], True
    for clip, (extra, chunk_tokens) in enumerate(zip((0, EXTRA_TOKENS), CHUNK_TOKENS)):
        clip_pairs, got, expected = _verify_clip(files, model, prompt, len(prompt) + new_tokens + extra, chunk_tokens,
                                                 new_tokens, seed=clip + 1)
        pairs += clip_pairs
        equal = equal and got == expected
        if clip == 0:
            onnx_tokens, torch_tokens = got, expected
    return verdict_of(pairs, tolerance, equal, onnx_tokens, torch_tokens)
