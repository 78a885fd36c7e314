"""`--verify` of a causal LM at the lengths where the model changes.

The folder's model runs in onnxruntime as a runtime runs it (a prefill with an empty
cache, then one token per step, the cache fed back) and is compared with
``model.generate(do_sample=False)``, twice: one prompt longer than every sliding window,
attention chunk and rope switch point (`fx2onnx.hub.decoders.model_lengths`), and a left-padded
batch of prompts of different lengths, with the positions transformers' generation
gives them. Every step's logits must be within the tolerance and every greedy token
equal. A difference or a failed run is reported with the sequence length it happened at.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fx2onnx.hub.shared.genai_config import token_ids
from fx2onnx.hub.decoders import text_only
from fx2onnx.hub.decoders.decode_step import decoder_sizes
from fx2onnx.hub.decoders.state_list import BATCH_ROWS_ALONE, takes_state_list
from fx2onnx.hub.decoders.model_lengths import VerificationLengths
from fx2onnx.hub.shared.verification import (
    FolderRunError, Greedy, Tolerance, Verification, greedy_in_folder, left_padded, plain_greedy, prefill_logits,
)


def fresh_rope_state(model: torch.nn.Module) -> None:
    """Give transformers' rotary embeddings the state of a newly loaded model: a dynamic
    NTK rope keeps the frequencies of the longest sequence it has run until one shorter
    than its original context comes, and the folder keeps no state from run to run."""
    for module in model.modules():
        original = getattr(module, "original_max_seq_len", None)
        if original is None or not hasattr(module, "max_seq_len_cached"):
            continue
        for name, buffer in list(module.named_buffers(recurse=False)):
            if name.endswith("original_inv_freq"):
                setattr(module, name.replace("original_inv_freq", "inv_freq"), buffer.clone())
        for name in [n for n in vars(module) if n.endswith("max_seq_len_cached")]:
            setattr(module, name, original)


class BatchReference(enum.Enum):
    """How transformers' reference for a left-padded batch of prompts is built."""

    BATCH = "the batch"
    # each row padded to the batch's width, as a batch of its own: for a model whose decode step
    # transformers computes wrongly for a batch (RWKV's, see `state_list`)
    PADDED_ROWS_ALONE = "padded rows alone"
    # each row alone without its padding: for a model whose decode step transformers computes
    # wrongly for a padded row (Git's without an image, see `text_only`)
    UNPADDED_ROWS = "rows unpadded"


def batch_reference(model: torch.nn.Module, text_only_folder: bool) -> tuple[BatchReference, str | None]:
    """The reference `--verify` compares the folder's batch with, for ``model`` (its folder
    text-only or not), and the note that says why when it is not the batch itself."""
    image_tokens = text_only.cached_image_tokens(model) if text_only_folder else 0
    if image_tokens:
        return BatchReference.UNPADDED_ROWS, text_only.BATCH_ROWS_UNPADDED.format(name=type(model).__name__,
                                                                                  tokens=image_tokens)
    if takes_state_list(model):
        return BatchReference.PADDED_ROWS_ALONE, BATCH_ROWS_ALONE
    return BatchReference.BATCH, None


def greedy_in_transformers(
    model: torch.nn.Module, prompts: list[list[int]], new_tokens: int, pad: int,
    reference: BatchReference = BatchReference.BATCH,
) -> Greedy:
    """``model.generate``'s greedy tokens and logits on the left-padded batch of ``prompts``,
    or on its rows alone as ``reference`` says."""
    if reference is not BatchReference.BATCH and len(prompts) > 1:
        # each row as a batch of its own: padded to the batch's width (to a model that reads no
        # mask, RWKV, the same row as in the batch) or without its padding
        width = max(len(p) for p in prompts)
        unpadded = reference is BatchReference.UNPADDED_ROWS
        alone = [p if unpadded else [pad] * (width - len(p)) + p for p in prompts]
        rows = [greedy_in_transformers(model, [row], new_tokens, pad) for row in alone]
        return Greedy([row.tokens[0] for row in rows], [np.concatenate([row.logits[i] for row in rows]) for i in
                                                        range(new_tokens)], [width + i for i in range(new_tokens)])
    ids, mask = left_padded(prompts, pad)
    fresh_rope_state(model)
    with torch.no_grad(), plain_greedy(model):
        generated = model.generate(
            torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), do_sample=False, max_new_tokens=new_tokens,
            min_new_tokens=new_tokens, output_logits=True, return_dict_in_generate=True, pad_token_id=pad,
        )
    tokens = generated.sequences[:, ids.shape[1]:].tolist()
    logits = [step.float().numpy() for step in generated.logits]
    return Greedy(tokens, logits, [ids.shape[1] + i for i in range(new_tokens)])


@dataclass
class LengthsVerification(Verification):
    """A causal LM's verification at the lengths of :class:`VerificationLengths`:
    ``failure`` says where it failed (a run of the folder, or the first greedy token that
    differs, with its sequence length) and ``worst_length`` the length of the largest
    difference."""

    lengths: str = ""
    worst_length: int = 0

    def summary(self) -> str:
        if self.failure is not None and not self.torch_tokens:
            return f"{self.failure} (lengths run: {self.lengths})"
        verdict = "within" if self.within_tolerance else f"{self.worst_ratio:.3g} times"
        tolerance = f"rtol={self.tolerance.rtol:g}, atol={self.tolerance.atol:g}"
        tokens = self.failure or ("greedy tokens equal" if self.tokens_equal is not None else "against the folder's one pass")
        return (f"largest difference {self.max_logit_difference:.3g} after {self.worst_length} tokens ({verdict} the "
                f"tolerance {tolerance}), {tokens}")


def _first_difference(ours: Greedy, theirs: Greedy, what: str) -> str | None:
    for step, length in enumerate(ours.lengths):
        rows = [r for r in range(len(ours.tokens)) if ours.tokens[r][step] != theirs.tokens[r][step]]
        if rows:
            row = rows[0]
            return (f"greedy tokens DIFFERENT after {length} tokens ({what}, row {row}: "
                    f"{ours.tokens[row][step]} instead of transformers' {theirs.tokens[row][step]})")
    return None


def _pad_and_banned(model: torch.nn.Module, config: Any) -> tuple[int, list[int]]:
    """The pad token of the batches and the end-of-text tokens greedy generation keeps from choosing."""
    pad = int(getattr(config, "pad_token_id", None) or 0)
    eos = token_ids(config, getattr(model, "generation_config", None))["eos_token_id"]
    return pad, [] if eos is None else eos if isinstance(eos, list) else [eos]


def _prompt_runs(config: Any, lengths: VerificationLengths, seed: int) -> dict[str, list[list[int]]]:
    """The prompts of each run at ``lengths``, by what the run is: the prompt alone, then the batch."""
    vocab = int(decoder_sizes(config).vocab_size)
    generator = torch.Generator().manual_seed(seed)
    runs = {
        f"the prompt of {lengths.prompt}": [lengths.prompt],
        f"the batch of {', '.join(map(str, lengths.batch))}": list(lengths.batch),
    }
    return {what: [torch.randint(min(3, vocab - 1), vocab, (size,), generator=generator).tolist() for size in sizes]
            for what, sizes in runs.items()}


def verify_steps_against_one_pass(
    path: Path, model: torch.nn.Module, config: Any, lengths: VerificationLengths, share: float, seed: int = 1,
    embedding: Path | None = None,
) -> LengthsVerification:
    """A folder's prompt and decode steps at ``lengths`` against its own one pass over the same
    text (the prompt and the tokens the folder chose, read at once), each step's logits within
    ``share`` of the one pass's largest logit: for a quantized folder, whose verification against
    transformers (`verify_quantized_causal_lm`) is one such pass, and whose tokens transformers'
    do not bound (near ties chosen otherwise), its cache at every length. The share bounds what
    onnxruntime's int8 activations move between one pass and single steps (their kernels differ:
    0.4% of the largest logit in the tests' int8 LLaMA); a state read wrong moves the logits by
    their size. The prompt alone: a left-padded batch need not read the same in one pass and in
    steps (DeepSeek-V4's windows do not)."""
    pad, banned = _pad_and_banned(model, config)
    what, prompts = next(iter(_prompt_runs(config, lengths, seed).items()))
    try:
        ours = greedy_in_folder(path, prompts, lengths.new_tokens, pad, banned, embedding)
        # the one pass's logits at each step: those of the position before each new token
        one_pass = prefill_logits(path, [prompts[0] + ours.tokens[0][:-1]], pad, embedding)[0, len(prompts[0]) - 1:]
    except FolderRunError as error:
        return LengthsVerification(float("inf"), None, [], [], Tolerance(0.0, 0.0), float("inf"),
                                   f"{error} while running {what}", lengths.describe(), error.length or 0)
    worst, worst_length, largest = 0.0, 0, 0.0
    tolerance = Tolerance(0.0, share * float(np.abs(one_pass).max()))
    for steps, expected, length in zip(ours.logits, one_pass, ours.lengths):
        steps, expected = steps[0].astype(np.float64), expected.astype(np.float64)
        largest = max(largest, float(np.abs(steps - expected).max()))
        if (ratio := tolerance.worst_ratio(steps, expected)) > worst:
            worst, worst_length = ratio, length
    return LengthsVerification(largest, None, ours.tokens[0], ours.tokens[0], tolerance, worst, None,
                               f"{what} and {lengths.new_tokens} decode steps", worst_length)


def verify_causal_lm_at_lengths(
    path: Path, model: torch.nn.Module, config: Any, lengths: VerificationLengths, tolerance: Tolerance, seed: int = 1,
    reference: BatchReference = BatchReference.BATCH, embedding: Path | None = None,
) -> LengthsVerification:
    """The folder's decoder against ``model.generate`` on one prompt and one batch (or the
    batch's rows alone, as ``reference`` says: `greedy_in_transformers`); ``embedding``: the
    model that embeds each step's ids for the decoder (`greedy_in_folder`)."""
    pad, banned = _pad_and_banned(model, config)
    worst, worst_length, largest, failure, first = 0.0, 0, 0.0, None, None
    for what, prompts in _prompt_runs(config, lengths, seed).items():
        try:
            ours = greedy_in_folder(path, prompts, lengths.new_tokens, pad, banned, embedding)
        except FolderRunError as error:
            return LengthsVerification(float("inf"), False, [], [], tolerance, float("inf"), f"{error} while running {what}",
                                       lengths.describe(), error.length or 0)
        theirs = greedy_in_transformers(model, prompts, lengths.new_tokens, pad, reference)
        first = first or (ours, theirs)
        for a, b, length in zip(ours.logits, theirs.logits, ours.lengths):
            ratio = tolerance.worst_ratio(a.astype(np.float64), b.astype(np.float64))
            largest = max(largest, float(np.abs(a.astype(np.float64) - b).max()))
            if ratio > worst:
                worst, worst_length = ratio, length
        failure = failure or _first_difference(ours, theirs, what)
    ours, theirs = first
    return LengthsVerification(
        largest, failure is None, ours.tokens[0], theirs.tokens[0], tolerance, worst, failure, lengths.describe(), worst_length
    )
