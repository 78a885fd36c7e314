"""transformers' Mamba mixers that read a padding mask of the new tokens only.

Mamba, Falcon-Mamba and Jamba's Mamba layers zero the hidden states of padding tokens with the 2D mask they are
given (`apply_mask_to_padding_states`), which must then be as long as this forward's tokens:
their `generate` passes the prompt's mask once and none on later steps. A decoder exported
with a cache takes the usual mask of the past and the new tokens, and multiplying by it fails
(sizes past + new against new). During a capture the mask's trailing positions are used,
those of this forward's tokens, as transformers' newer recurrent mixers do
(`create_recurrent_attention_mask`): on the prompt it is the whole mask, and on a later step
the new tokens' ones, which leave them as they are, as no mask does.

Knows transformers only by name (library_adapters.CAPTURE_REWRITES): never imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def mask_of_the_new_tokens(original: Callable[..., Any]) -> Callable[..., Any]:
    """``apply_mask_to_padding_states(hidden_states, attention_mask)`` given the mask's
    positions of ``hidden_states``' tokens (its last ones) when it covers past tokens too."""

    def apply_mask_to_padding_states(hidden_states: torch.Tensor, attention_mask: Any) -> Any:
        if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
            attention_mask = attention_mask[:, attention_mask.shape[1] - hidden_states.shape[1]:]
        return original(hidden_states, attention_mask)

    apply_mask_to_padding_states.__wrapped__ = original  # type: ignore[attr-defined]
    return apply_mask_to_padding_states
