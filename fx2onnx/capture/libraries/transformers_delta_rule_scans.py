"""transformers' chunked gated delta rule with the number of chunks kept symbolic.

The gated-delta-rule layers of Qwen3-Next, Qwen3.5 (dense and MoE), OLMo-hybrid and the
decoders that copy them read a prompt in chunks (``torch_chunk_gated_delta_rule``, the same
function in each family's module): the prompt is padded to whole chunks of a ``chunk_size``
that is the function's default argument (64), not in the config, and a Python loop runs
over the chunks. torch.export unrolls that loop for the example's one chunk: the exported
model reads only the first chunk of any longer prompt. During a capture the rule is
computed here: within a chunk as transformers does (the unit triangular system solved by
blocks of doubling size, a fixed number of matrix products), across chunks as a ``scan``
over a count written as one floor division of the length, ``ceil(length / chunk) + 1``
(a chunk of zeros past the tokens has no key, value or gate: it changes no state and its
outputs are dropped by index). The chunks are half of ``chunk_size`` long, as the
Mamba2-style scans' (transformers_chunked_scans.py): the same sum for any chunk, and a decode
step then scans two half chunks.

Knows transformers only by name (library_adapters.CAPTURE_REWRITES): never imports it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

from fx2onnx.private_ops import scan_function

# the families whose module defines transformers' `torch_chunk_gated_delta_rule`
GATED_DELTA_RULE_FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid", "qwen4_exp", "lara_mini")
GATED_DELTA_RULE_FUNCTION = "torch_chunk_gated_delta_rule"


def default_chunk(function: Callable[..., Any]) -> int | None:
    """The ``chunk_size`` default of a chunked scan function (its own, or its wrapped one's)."""
    try:
        parameter = inspect.signature(inspect.unwrap(function)).parameters.get("chunk_size")
    except (TypeError, ValueError):
        return None
    default = None if parameter is None else parameter.default
    return default if isinstance(default, int) and default > 0 else None


def _unit_lower_inverse(matrix: torch.Tensor) -> torch.Tensor:
    """The inverse of unit lower triangular ``matrix`` (..., n, n), from the inverses of its
    diagonal blocks, doubling the block each step: ``[[A, 0], [C, D]]`` has the inverse
    ``[[A⁻¹, 0], [-D⁻¹ C A⁻¹, D⁻¹]]``; ``n`` is padded with identity to a power of two.
    ONNX has no triangular solve, and a substitution row by row is ``n`` in-place updates;
    this is ``log2(n)`` batched products."""
    size = matrix.shape[-1]
    full = 1 << max(0, (size - 1).bit_length())
    if full != size:
        identity_tail = torch.diag(F.pad(torch.zeros(size, dtype=matrix.dtype, device=matrix.device), (0, full - size), value=1.0))
        matrix = F.pad(matrix, (0, full - size, 0, full - size)) + identity_tail
    lead = matrix.shape[:-2]
    inverse = torch.ones(*lead, full, 1, 1, dtype=matrix.dtype, device=matrix.device)  # the inverses of the 1x1 diagonal blocks
    block = 1
    while block < full:
        pairs = full // (2 * block)
        # C of each pair of diagonal blocks, and the pair's inverses A⁻¹ and D⁻¹
        lower = torch.stack([
            matrix[..., start + block:start + 2 * block, start:start + block] for start in range(0, full, 2 * block)
        ], dim=-3)
        first, second = inverse.reshape(*lead, pairs, 2, block, block).unbind(-3)
        top = torch.cat([first, torch.zeros_like(first)], dim=-1)
        bottom = torch.cat([-second @ lower @ first, second], dim=-1)
        inverse = torch.cat([top, bottom], dim=-2)
        block *= 2
    return inverse.reshape(*lead, full, full)[..., :size, :size]


def _l2_normalized(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


def _chunk_step(state: torch.Tensor, chunk: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk: the state it ends with, and its outputs read from the state it starts from and its own tokens."""
    query, key, new_values, read_keys, within, decay = chunk
    corrected = new_values - read_keys @ state
    output = query @ state + within @ corrected
    return state * decay + key.transpose(-1, -2) @ corrected, output


def gated_delta_rule(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, chunk_size: int,
    initial_state: torch.Tensor | None = None, output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gated delta rule over (batch, length, heads, dim) inputs read in chunks of
    ``chunk_size``: within each chunk in closed form, across chunks as a scan of the state."""
    dtype = query.dtype
    batch, length, key_heads, key_dim = key.shape
    value_heads, value_dim = value.shape[-2:]
    if key_heads != value_heads:
        query = query.repeat_interleave(value_heads // key_heads, dim=2)
        key = key.repeat_interleave(value_heads // key_heads, dim=2)
    query, key, value, beta, g = (x.transpose(1, 2).float() for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        query, key = _l2_normalized(query), _l2_normalized(key)
    query = query * key_dim ** -0.5
    # the chunks the tokens need and one of zeros (see the module's notes): one floor division
    chunks = (length + 2 * chunk_size - 1) // chunk_size
    padding = chunks * chunk_size - length
    query, key, value = (F.pad(x, (0, 0, 0, padding)).reshape(batch, value_heads, chunks, chunk_size, -1)
                         for x in (query, key, value))
    beta, g = (F.pad(x, (0, padding)).reshape(batch, value_heads, chunks, chunk_size) for x in (beta, g))
    weighted_values, weighted_keys = value * beta[..., None], key * beta[..., None]
    decay_sums = g.cumsum(dim=-1)
    # exp of the decay from position j to i of a chunk, for j <= i
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=query.device).triu(1)
    pairwise = (decay_sums[..., :, None] - decay_sums[..., None, :]).masked_fill(upper, float("-inf")).exp()
    system = torch.eye(chunk_size, device=query.device) + ((weighted_keys @ key.transpose(-1, -2)) * pairwise).tril(-1)
    solved = _unit_lower_inverse(system)
    new_values = solved @ weighted_values
    read_keys = solved @ (weighted_keys * decay_sums.exp()[..., None])
    within = (query @ key.transpose(-1, -2)) * pairwise
    query = query * decay_sums.exp()[..., None]
    key = key * (decay_sums[..., -1:] - decay_sums).exp()[..., None]
    chunk_decay = decay_sums[..., -1].exp()[..., None, None]
    state = (torch.zeros(batch, value_heads, key_dim, value_dim, device=query.device) if initial_state is None
             else initial_state.to(torch.float32))
    # the chunks' dim first, as scan reads it
    steps = [x.movedim(2, 0) for x in (query, key, new_values, read_keys, within, chunk_decay)]
    final_state, outputs = scan_function()(_chunk_step, state, steps)
    output = outputs.movedim(0, 2).reshape(batch, value_heads, chunks * chunk_size, value_dim)
    output = output.index_select(2, torch.arange(length, device=output.device))
    output = output.transpose(1, 2).to(dtype).contiguous()
    return output, (final_state if output_final_state else None)


def delta_rule_with_symbolic_chunks(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch_chunk_gated_delta_rule`` computed by :func:`gated_delta_rule` in half chunks;
    packed sequences (``cu_seqlens``), which only the kernels keep apart, go to the original."""

    def torch_chunk_gated_delta_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                                     beta: torch.Tensor, chunk_size: int = default_chunk(original) or 64,
                                     initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                                     use_qk_l2norm_in_kernel: bool = False, **kwargs: Any) -> Any:
        if kwargs.get("cu_seqlens") is not None:
            return original(query, key, value, g=g, beta=beta, chunk_size=chunk_size, initial_state=initial_state,
                            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                            **kwargs)
        half_chunk = max(1, chunk_size // 2)  # the chunk of zeros costs a half chunk (see the module's notes)
        return gated_delta_rule(query, key, value, g, beta, half_chunk, initial_state, output_final_state,
                                use_qk_l2norm_in_kernel)

    torch_chunk_gated_delta_rule.__wrapped__ = original  # type: ignore[attr-defined]
    return torch_chunk_gated_delta_rule
