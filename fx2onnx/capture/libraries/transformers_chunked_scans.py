"""transformers' Mamba2-style chunked scans with the number of chunks kept symbolic.

Mamba2's mixer and the hybrid decoders built on it (Bamba, Falcon-H1, Granite-MoE-hybrid,
Nemotron-H, Zamba2) read a prompt in chunks of ``chunk_size`` tokens
(``mamba2_chunk_scan``, the same function in each family's module): it pads the sequence
by ``(chunk_size - length % chunk_size) % chunk_size`` and lets ``reshape(..., -1, chunk_size,
...)`` infer the number of chunks. torch.export cannot simplify that count, and a capture
from a prompt shorter than a chunk fixes it at the example's one chunk: the exported model
fails (or differs) on every prompt longer than ``chunk_size``. During a capture the scan is
computed here with the count written as one floor division of the length,
``ceil(length / chunk) + 1`` (a chunk of zeros past the tokens, which adds nothing to any
state or output, keeps the count from being 1 in an example), the padding as
``count * chunk - length`` and the tokens' outputs taken by index: exact for every length.
The chunks are half of ``chunk_size`` long: a scan in chunks is the same sum for any chunk
length (it differs from transformers' by float rounding, about 1e-7 relative), and a
single-token decode step then scans two half chunks, half the work of one whole chunk,
rather than two whole ones (bench/chunked_scan_cost.py).

Knows transformers only by name (library_adapters.CAPTURE_REWRITES): never imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

# the families whose module defines transformers' `mamba2_chunk_scan`
MAMBA2_SCAN_FAMILIES = ("mamba2", "bamba", "falcon_h1", "granitemoehybrid", "nemotron_h", "zamba2")


def _segment_sums(values: torch.Tensor) -> torch.Tensor:
    """``out[..., i, j]``: the sum of ``values[..., j+1 : i+1]`` where ``i >= j``, -inf above the
    diagonal; a cumulative sum of the masked values, as transformers' `segment_sum` does."""
    count = values.shape[-1]
    positions = torch.arange(count, device=values.device)
    below = positions[:, None] > positions[None, :]
    summed = torch.cumsum(torch.where(below, values[..., :, None], torch.zeros((), dtype=values.dtype)), dim=-2)
    on_or_below = positions[:, None] >= positions[None, :]
    return torch.where(on_or_below, summed, torch.full((), float("-inf"), dtype=values.dtype))


def chunk_count(length: Any, chunk_size: int) -> Any:
    """The chunks ``length`` tokens need and one of zeros, which changes no state and no
    output: a count never 1, which torch would otherwise fix to an example's single chunk (a
    view's strides ask whether a size is 1, in the capture and again when its program is
    re-traced); one floor division, whose multiples torch knows divisible by it."""
    return (length + 2 * chunk_size - 1) // chunk_size


def into_chunks(tensor: torch.Tensor, chunks: Any, chunk_size: int, axis: int = 1) -> torch.Tensor:
    """``tensor`` padded with zeros along its token ``axis`` to ``chunks * chunk_size`` tokens
    and split there into (..., chunks, chunk_size, ...)."""
    padding = chunks * chunk_size - tensor.shape[axis]
    padded = F.pad(tensor, [0, 0] * (tensor.dim() - 1 - axis) + [0, padding])
    return padded.reshape(*tensor.shape[:axis], chunks, chunk_size, *tensor.shape[axis + 1:])


def chunked_scan(
    hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int,
    D: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None, initial_states: torch.Tensor | None = None,
    dt_softplus: bool = False, dt_limit: tuple[float, float] = (0.0, float("inf")), return_final_states: bool = False,
) -> Any:
    """The state-space scan of ``hidden_states`` (batch, length, heads, head_dim) read in chunks:
    within each chunk as a masked product, across chunks as a recurrence of their end states."""
    batch, length, heads, head_dim = hidden_states.shape
    groups = B.shape[2]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1])
    x = hidden_states.float()
    B = B.float().repeat_interleave(heads // groups, dim=2, output_size=heads)
    C = C.float().repeat_interleave(heads // groups, dim=2, output_size=heads)
    chunks = chunk_count(length, chunk_size)
    x_dt = x * dt[..., None].float()
    decay = A.to(x.dtype) * dt.float()
    x_dt, decay, B, C = (into_chunks(t, chunks, chunk_size) for t in (x_dt, decay, B, C))
    decay = decay.permute(0, 3, 1, 2)  # (batch, heads, chunks, chunk_size)
    decay_sums = torch.cumsum(decay, dim=-1)
    # within a chunk: scores of C against B, decayed between the two positions
    scores = torch.einsum("bclhn,bcshn->bclsh", C, B) * torch.exp(_segment_sums(decay)).permute(0, 2, 3, 4, 1)
    within = torch.einsum("bclsh,bcshp->bclhp", scores, x_dt)
    # each chunk's own end state, then the state every chunk starts from
    to_the_end = torch.exp(decay_sums[:, :, :, -1:] - decay_sums)
    states = torch.einsum("bclhn,bclhp->bchpn", B * to_the_end.permute(0, 2, 3, 1)[..., None], x_dt)
    first = initial_states[:, None].to(states.dtype) if initial_states is not None else torch.zeros_like(states[:, :1])
    states = torch.cat([first, states], dim=1)
    across = torch.exp(_segment_sums(F.pad(decay_sums[:, :, :, -1], (1, 0)))).transpose(1, 3)
    states = torch.einsum("bzch,bzhpn->bchpn", across, states)
    starts, final_state = states[:, :-1], states[:, -1]
    # from each chunk's start state to its tokens
    carried = torch.einsum("bclhn,bchpn->bclhp", C, starts) * torch.exp(decay_sums).permute(0, 2, 3, 1)[..., None]
    # the sequence's own tokens taken by index: a slice's bound (length <= chunks * chunk_size)
    # is a guard torch cannot prove
    output = (within + carried).reshape(batch, chunks * chunk_size, heads, head_dim)
    output = output.index_select(1, torch.arange(length, device=output.device))
    if D is not None:
        output = output + D[..., None] * x
    return (output, final_state) if return_final_states else output


def scan_with_symbolic_chunks(original: Callable[..., Any]) -> Callable[..., Any]:
    """``mamba2_chunk_scan`` computed by :func:`chunked_scan` in half chunks; packed sequences
    (``seq_idx``, ``cu_seqlens``), which only the kernels keep apart, go to the original."""

    def mamba2_chunk_scan(hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                          C: torch.Tensor, chunk_size: int, D: torch.Tensor | None = None,
                          dt_bias: torch.Tensor | None = None, initial_states: torch.Tensor | None = None,
                          dt_softplus: bool = False, dt_limit: tuple[float, float] = (0.0, float("inf")),
                          return_final_states: bool = False, **kwargs: Any) -> Any:
        if kwargs.get("seq_idx") is not None or kwargs.get("cu_seqlens") is not None:
            return original(hidden_states, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias, initial_states=initial_states,
                            dt_softplus=dt_softplus, dt_limit=dt_limit, return_final_states=return_final_states, **kwargs)
        half_chunk = max(1, chunk_size // 2)  # the chunk of zeros costs a half chunk (see the module's notes)
        return chunked_scan(hidden_states, dt, A, B, C, half_chunk, D, dt_bias, initial_states, dt_softplus, dt_limit,
                            return_final_states)

    mamba2_chunk_scan.__wrapped__ = original  # type: ignore[attr-defined]
    return mamba2_chunk_scan
