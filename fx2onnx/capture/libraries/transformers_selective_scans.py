"""transformers' Mamba (v1) selective scan over a sequence of symbolic length, from the cache's state.

Mamba, Falcon-Mamba, Jamba's and Zamba's Mamba layers scan a prompt in ``mamba_selective_scan`` (the
same function in each family's module) with a Python loop over its tokens, which
torch.export unrolls for the example's length: the exported model accepts only that
length. Their mixer also starts that scan from zeros, never from the cache's recurrent
state, and reads the state only on a step of one token (``mamba_selective_state_update``),
a branch a capture of a symbolic length cannot take. During a capture the scan is a
``scan`` over the tokens (an ONNX Scan, any length) that starts from the state the layer's
cache holds: zeros on the prompt, as transformers', and the previous step's state after,
where one step of the recurrence is transformers' single-token update. The mixer's
``forward`` is wrapped to hand its layer's state to the scan, which transformers does not
pass it. Zamba's mixer splits its channels into heads, each with its own state (the cache's
state is batch, heads, channels, state) and scanned by its own call, in the heads' order:
each call takes the next head's state.

Knows transformers only by name (library_adapters.CAPTURE_REWRITES): never imports it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.nn import functional as F

from fx2onnx.private_ops import scan_function

# the families whose module defines transformers' `mamba_selective_scan`, with their mixer's class
SELECTIVE_SCAN_MIXERS = {"mamba": "MambaMixer", "falcon_mamba": "FalconMambaMixer", "jamba": "JambaMambaMixer",
                         "zamba": "ZambaMambaMixer"}
SELECTIVE_SCAN_FUNCTION = "mamba_selective_scan"

# the recurrent states of the running mixer's scans, the next call's first (none: each starts from zeros)
_layer_states: contextvars.ContextVar[Iterator[torch.Tensor] | None] = contextvars.ContextVar(
    "mamba_layer_states", default=None)


def _next_state() -> torch.Tensor | None:
    states = _layer_states.get()
    return None if states is None else next(states, None)


@contextlib.contextmanager
def _starting_from(state: torch.Tensor | None) -> Iterator[None]:
    """The scans in the block start from ``state``: batch, channels, state for one scan;
    batch, heads, channels, state for one scan a head (Zamba's), called in the heads' order."""
    states = None if state is None else iter(state.unbind(1) if state.dim() == 4 else (state,))
    token = _layer_states.set(states)
    try:
        yield
    finally:
        _layer_states.reset(token)


def _token_step(state: torch.Tensor, token: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: the state decayed and fed its input, and the output read from it by ``C``."""
    decay, update, read = token
    state = decay * state + update
    return state, (state @ read[..., None])[..., 0]


def selective_scan(
    hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    D: torch.Tensor | None = None, z: torch.Tensor | None = None, delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False, return_last_state: bool = False, initial_state: torch.Tensor | None = None,
) -> Any:
    """The selective scan of ``hidden_states`` (batch, channels, length) with ``dt`` of that
    shape, ``A`` (channels, state) and ``B``, ``C`` (batch, state, length): a recurrence over
    the tokens from ``initial_state`` (batch, channels, state; zeros when None)."""
    batch, channels, _ = hidden_states.shape
    input_dtype = hidden_states.dtype
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    # per token (leading dim), in float32 as transformers' loop: the decay exp(A dt), the input dt B x, and C
    decay = torch.exp(A[None, :, None, :] * dt[..., None]).float().permute(2, 0, 1, 3)
    update = (dt[..., None] * B.transpose(1, 2)[:, None].float() * hidden_states[..., None].float()).permute(2, 0, 1, 3)
    read = C.float().permute(2, 0, 1)
    if initial_state is None:
        state = torch.zeros(batch, channels, A.shape[-1], dtype=torch.float32, device=hidden_states.device)
    else:
        state = initial_state.float().contiguous()  # a head's state is a strided view; the scan's carry is contiguous
    final_state, outputs = scan_function()(_token_step, state, [decay, update, read])
    output = outputs.permute(1, 2, 0).to(input_dtype)
    if D is not None:
        output = output + hidden_states * D[None, :, None]
    if z is not None:
        output = output * F.silu(z)
    return (output, final_state) if return_last_state else output


def scan_over_symbolic_length(original: Callable[..., Any]) -> Callable[..., Any]:
    """``mamba_selective_scan`` computed by :func:`selective_scan` from the running layer's state."""

    def mamba_selective_scan(hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                             C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                             delta_bias: torch.Tensor | None = None, delta_softplus: bool = False,
                             return_last_state: bool = False, **kwargs: Any) -> Any:
        return selective_scan(hidden_states, dt, A, B, C, D, z, delta_bias, delta_softplus, return_last_state,
                              _next_state())

    mamba_selective_scan.__wrapped__ = original  # type: ignore[attr-defined]
    return mamba_selective_scan


def mixer_handing_its_state(original: Callable[..., Any]) -> Callable[..., Any]:
    """A Mamba mixer's ``forward`` that hands its cache's recurrent state to the scan."""

    def forward(self: torch.nn.Module, hidden_states: torch.Tensor, cache: Any = None, *args: Any, **kwargs: Any) -> Any:
        state = None
        if cache is not None and hasattr(cache, "get_recurrent_state"):
            state = cache.get_recurrent_state(self.layer_idx, state_idx=0)
        with _starting_from(state):
            return original(self, hidden_states, cache, *args, **kwargs)

    forward.__wrapped__ = original  # type: ignore[attr-defined]
    return forward
