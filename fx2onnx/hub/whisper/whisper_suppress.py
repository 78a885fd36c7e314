"""Whisper's suppress lists in the decoder graph, for runtimes that decode plain greedy.

transformers' Whisper `generate` never picks the tokens of `generation_config.json`'s
`suppress_tokens` (their logits are set to -inf at every step) and, at the first generated
step only, those of `begin_suppress_tokens` (a space, end of text). ONNX Runtime GenAI has
no option for either, so the decoder's `logits` output carries them:

- `suppress_tokens`: -inf in every row;
- `begin_suppress_tokens`: -inf in the row that picks the first generated token. That is
  the last row of the call with an empty self-attention cache (a past of length 0: the
  runtime's first call, which reads the whole prompt, language, task and
  `<|notimestamps|>` tokens included, as transformers' `begin_index` is the prompt's
  length). The step is read from the cache's length, so the graph knows it without an input.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def suppress_lists(generation_config: Any) -> tuple[list[int], list[int]]:
    """The generation config's `suppress_tokens` and `begin_suppress_tokens` (empty when unset)."""
    def ids(name: str) -> list[int]:
        value = getattr(generation_config, name, None) if generation_config is not None else None
        return sorted({int(i) for i in value or []})

    return ids("suppress_tokens"), ids("begin_suppress_tokens")


class SuppressedLogits(nn.Module):
    """-inf at the suppressed tokens of the logits (batch, rows, vocab) of a decoder call
    whose self-attention cache held ``past`` tokens."""

    def __init__(self, vocab: int, suppress: list[int], begin_suppress: list[int]) -> None:
        super().__init__()
        self.register_buffer("always", self._mask(vocab, suppress), persistent=False)
        self.register_buffer("at_begin", self._mask(vocab, begin_suppress), persistent=False)
        self.active = bool(suppress or begin_suppress)

    @staticmethod
    def _mask(vocab: int, ids: list[int]) -> torch.Tensor:
        outside = [i for i in ids if not 0 <= i < vocab]
        if outside:
            raise ValueError(
                f"generation_config.json suppresses tokens {outside[:5]} outside the vocabulary of {vocab} tokens: "
                "fix its suppress_tokens / begin_suppress_tokens for this tokenizer."
            )
        mask = torch.zeros(vocab, dtype=torch.bool)
        mask[ids] = True
        return mask

    def forward(self, logits: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        """``past``: a tensor whose dim 2 is the cache's length (a past key of the self-attention)."""
        if not self.active:
            return logits
        rows = torch.arange(logits.shape[1], device=logits.device)
        last = rows == logits.shape[1] - 1
        # the last row, in a call whose first row is position 0: the first generated token
        first_pick = last & (rows + past.shape[2] == logits.shape[1] - 1)
        mask = self.always | (first_pick[:, None] & self.at_begin)
        return logits.masked_fill(mask, float("-inf"))
