"""transformers' recurrences that run a Python loop over the tokens, as a scan.

RecurrentGemma's linear recurrence (``RecurrentGemmaRglru._rnn_scan``) and RWKV's time-mix
recurrence (``rwkv_linear_attention_cpu``) loop ``for t in range(length)``: torch.export
unrolls the loop for the example's tokens and fixes the sequence length to theirs. During a
capture each is computed here as a ``scan`` over the tokens (an ONNX ``Scan``), with the same
operations per token as transformers' loop, so the results are the same for every length.
Their branches for a single token compute what the loop computes for one, so the scan
serves them too.

Knows transformers only by name (library_adapters.CAPTURE_REWRITES): never imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fx2onnx.private_ops import scan_function

# RWKV's start of the running maximum of its exponents, as transformers' loop starts it
_NO_MAXIMUM = -1e38


def linear_recurrence_scan(original: Callable[..., Any]) -> Callable[..., Any]:
    """``RecurrentGemmaRglru._rnn_scan``: ``state = gate[t] * state + x[t]`` over the
    tokens, in ``acc_dtype``, from ``recurrent_states`` (zeros when None)."""

    def _rnn_scan(self: Any, hidden_states: torch.Tensor, recurrent_gate: torch.Tensor, reset: torch.Tensor,
                  recurrent_states: torch.Tensor | None, acc_dtype: torch.dtype = torch.float32) -> Any:
        gate = (recurrent_gate * ~reset).type(acc_dtype)
        if recurrent_states is None:
            recurrent_states = torch.zeros(hidden_states[:, 0].shape, dtype=acc_dtype, device=hidden_states.device)
        start = recurrent_states.type(acc_dtype).contiguous()

        def step(state: torch.Tensor, token: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            token_gate, token_input = token
            state = token_gate * state + token_input.type(acc_dtype)
            return state, state.type(hidden_states.dtype).clone()

        final, outputs = scan_function()(step, start, [gate.movedim(1, 0), hidden_states.movedim(1, 0)])
        return outputs.movedim(0, 1), final

    _rnn_scan.__wrapped__ = original  # type: ignore[attr-defined]
    return _rnn_scan


def wkv_scan(original: Callable[..., Any]) -> Callable[..., Any]:
    """``rwkv_linear_attention_cpu``: RWKV's weighted key-value average over the tokens, with
    its numerator, denominator and running maximum as the state."""

    def rwkv_linear_attention_cpu(time_decay: torch.Tensor, time_first: torch.Tensor, key: torch.Tensor,
                                  value: torch.Tensor, state: Any = None, return_state: bool = False) -> Any:
        if state is None:
            numerator = torch.zeros_like(key[:, 0], dtype=torch.float32)
            start = [numerator, torch.zeros_like(numerator), torch.zeros_like(numerator) + _NO_MAXIMUM]
        else:  # a layer's slices of the model's state: the scan carries them contiguous
            start = [part.contiguous() for part in state]
        decay = -torch.exp(time_decay)

        def step(carried: list[torch.Tensor], token: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
            numerator, denominator, maximum = carried
            token_key, token_value = token[0].float(), token[1]
            for_output = torch.maximum(maximum, token_key + time_first)
            e1, e2 = torch.exp(maximum - for_output), torch.exp(token_key + time_first - for_output)
            output = ((e1 * numerator + e2 * token_value) / (e1 * denominator + e2)).to(key.dtype)
            for_state = torch.maximum(maximum + decay, token_key)
            e1, e2 = torch.exp(maximum + decay - for_state), torch.exp(token_key - for_state)
            return [e1 * numerator + e2 * token_value, e1 * denominator + e2, for_state], output

        final, outputs = scan_function()(step, start, [key.movedim(1, 0), value.movedim(1, 0)])
        return outputs.movedim(0, 1), (final if return_state or state is not None else None)

    rwkv_linear_attention_cpu.__wrapped__ = original  # type: ignore[attr-defined]
    return rwkv_linear_attention_cpu
