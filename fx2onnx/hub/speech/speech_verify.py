"""`--verify` of a speech encoder-decoder folder in Optimum's layout: the encoder and the
merged decoder chained as Transformers.js chains them (the first step with
`use_cache_branch` false and an empty past), greedy over a batch of clips (one padded,
with its mask where the folder reads one), against
transformers' own greedy `generate` on the same features."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fx2onnx.hub.shared.verification import (
    Tolerance, Verification, cpu_session, empty_cache, greedy_decode, plain_greedy, run_session, verdict_of,
)


def _end_tokens(model: torch.nn.Module) -> list[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return [eos] if isinstance(eos, int) else list(eos or [])


def generated(model: torch.nn.Module, inputs: dict[str, torch.Tensor], steps: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """transformers' greedy search of ``steps`` tokens (the end of text held back until then,
    as `min_new_tokens` does) from the decoder start its generation config names: the
    sequences (the start first) and each step's logits. The search of GenerationMixin itself:
    a model's own `generate` (Whisper's prompt of language and task, SeamlessM4T's target
    language) adds tokens the folder's caller chooses."""
    from transformers import GenerationMixin

    with torch.no_grad(), plain_greedy(model):
        out = GenerationMixin.generate(
            model, **inputs, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, num_beams=1,
            output_logits=True, return_dict_in_generate=True,
        )
    return out.sequences, list(out.logits)


def verify_speech_seq2seq(
    encoder_path: Path, decoder_path: Path, model: torch.nn.Module, encoder_inputs: dict[str, torch.Tensor], steps: int,
    tolerance: Tolerance,
) -> Verification:
    """The folder's greedy tokens and logits for the batch ``encoder_inputs`` against
    `generated`'s; the tokens compared are the batch's, row after row."""
    sequences, torch_logits = generated(model, encoder_inputs, steps)
    starts = sequences[:, :1].tolist()
    with cpu_session(encoder_path) as encoder, cpu_session(decoder_path) as decoder:
        hidden = run_session(encoder, {k: v.numpy() for k, v in encoder_inputs.items()})["last_hidden_state"]

        # a padded batch's mask, where the folder reads one: the encoder's input's, as Transformers.js feeds it
        mask = {"encoder_attention_mask": encoder_inputs["attention_mask"].numpy()} if "attention_mask" in encoder_inputs else {}

        def step_feed(step: np.ndarray, _mask: np.ndarray, index: int) -> dict[str, np.ndarray]:
            return {"input_ids": step, "encoder_hidden_states": hidden, "use_cache_branch": np.array([index > 0]), **mask}

        greedy = greedy_decode(lambda feed: run_session(decoder, feed), empty_cache(decoder, len(starts)), starts, steps,
                               banned=_end_tokens(model), feed=step_feed)
    onnx_tokens = [token for row in greedy.tokens for token in row]
    torch_tokens = [token for row in sequences[:, 1:].tolist() for token in row]
    return verdict_of(zip(greedy.logits, torch_logits), tolerance, onnx_tokens == torch_tokens, onnx_tokens, torch_tokens)
