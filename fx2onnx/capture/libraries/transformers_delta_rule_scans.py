"""transformers' chunked delta rules (gated, and Kimi's) with the number of chunks kept symbolic.

The gated-delta-rule layers of Qwen3-Next, Qwen3.5 (dense and MoE), OLMo-hybrid and the
decoders that copy them read a prompt in chunks (``torch_chunk_gated_delta_rule``, the same
function in each family's module), as do Kimi-Linear, Bailing-hybrid and GLM-5-next with a
decay per key channel (``chunk_kimi_delta_attention``): the prompt is padded to whole chunks
of a ``chunk_size`` that is the function's default argument (64), not in the config, and a
Python loop runs over the chunks. torch.export unrolls that loop for the example's one
chunk: the exported model reads only the first chunk of a longer prompt, or fails on it.
During a capture the rule is computed here: within a chunk as transformers does (the unit
triangular system solved by blocks of doubling size, a fixed number of matrix products),
across chunks as a ``scan`` over a count written as one floor division of the length,
``ceil(length / chunk) + 1`` (a chunk of zeros past the tokens has no key or value: it
changes no state, and its outputs are dropped by index). The chunks are half of
``chunk_size`` long, as the Mamba2-style scans' (transformers_chunked_scans.py): the same
sum for any chunk, and a decode step then scans two half chunks.

Knows transformers only by name (library_adapters.CAPTURE_REWRITES): never imports it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

from fx2onnx.capture.libraries.transformers_chunked_scans import chunk_count, into_chunks
from fx2onnx.private_ops import scan_function

# the families whose module defines transformers' `torch_chunk_gated_delta_rule`
GATED_DELTA_RULE_FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid", "qwen4_exp", "lara_mini")
GATED_DELTA_RULE_FUNCTION = "torch_chunk_gated_delta_rule"
# the families whose module defines transformers' `chunk_kimi_delta_attention` (a decay per key channel)
KIMI_DELTA_RULE_FAMILIES = ("kimi_linear", "bailing_hybrid", "glm5_next")
KIMI_DELTA_RULE_FUNCTION = "chunk_kimi_delta_attention"


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


def _in_chunks(tensors: tuple[torch.Tensor, ...], length: Any, chunk_size: int) -> tuple[Any, list[torch.Tensor]]:
    """The number of chunks (those the tokens need and one of zeros, see the module's notes:
    one floor division) and ``tensors`` (batch, heads, length, ...) padded with zeros and
    split into (batch, heads, chunks, chunk_size, ...)."""
    chunks = chunk_count(length, chunk_size)
    return chunks, [into_chunks(t, chunks, chunk_size, axis=2) for t in tensors]


def _scan_chunks(state: torch.Tensor, steps: list[torch.Tensor], length: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunks' outputs (batch, length, heads, value_dim) and the final state, from each
    chunk's decayed queries and keys, corrected values, keys that read the state, attention
    within and decay (batch, heads, chunks, ...): a scan over the chunks' dim."""
    final_state, outputs = scan_function()(_chunk_step, state, [x.movedim(2, 0) for x in steps])
    output = outputs.movedim(0, 2).flatten(2, 3)
    return output.index_select(2, torch.arange(length, device=output.device)).transpose(1, 2), final_state


def _start_state(initial_state: torch.Tensor | None, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    if initial_state is not None:
        return initial_state.to(torch.float32)
    return torch.zeros(*key.shape[:2], key.shape[-1], value.shape[-1], device=key.device)


def _chunked_inputs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                    chunk_size: int, normalize: bool) -> list[torch.Tensor]:
    """The query (scaled), key, values and keys weighted by ``beta``, and decay, in float32,
    heads first and in chunks: (batch, heads, chunks, chunk_size, ...)."""
    query, key, value, beta, g = (x.transpose(1, 2).float() for x in (query, key, value, beta, g))
    if normalize:
        query, key = _l2_normalized(query), _l2_normalized(key)
    query = query * query.shape[-1] ** -0.5
    _, (query, key, value, beta, g) = _in_chunks((query, key, value, beta, g), key.shape[2], chunk_size)
    return [query, key, value * beta[..., None], key * beta[..., None], g]


def _final(output: torch.Tensor, final_state: torch.Tensor, dtype: torch.dtype,
           output_final_state: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    return output.to(dtype).contiguous(), (final_state if output_final_state else None)


def gated_delta_rule(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, chunk_size: int,
    initial_state: torch.Tensor | None = None, output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gated delta rule (a decay per head and token) over (batch, length, heads, dim)
    inputs read in chunks of ``chunk_size``: within each chunk in closed form, across chunks
    as a scan of the state."""
    dtype, length = query.dtype, key.shape[1]
    key_heads, value_heads = key.shape[2], value.shape[2]
    if key_heads != value_heads:
        query = query.repeat_interleave(value_heads // key_heads, dim=2)
        key = key.repeat_interleave(value_heads // key_heads, dim=2)
    query, key, weighted_values, weighted_keys, g = _chunked_inputs(query, key, value, g, beta, chunk_size,
                                                                     use_qk_l2norm_in_kernel)
    decay_sums = g.cumsum(dim=-1)
    # exp of the decay from position j to i of a chunk, for j <= i
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=query.device).triu(1)
    pairwise = (decay_sums[..., :, None] - decay_sums[..., None, :]).masked_fill(upper, float("-inf")).exp()
    system = torch.eye(chunk_size, device=query.device) + ((weighted_keys @ key.transpose(-1, -2)) * pairwise).tril(-1)
    solved = _unit_lower_inverse(system)
    steps = [query * decay_sums.exp()[..., None], key * (decay_sums[..., -1:] - decay_sums).exp()[..., None],
             solved @ weighted_values, solved @ (weighted_keys * decay_sums.exp()[..., None]),
             (query @ key.transpose(-1, -2)) * pairwise, decay_sums[..., -1].exp()[..., None, None]]
    output, final_state = _scan_chunks(_start_state(initial_state, key, weighted_values), steps, length)
    return _final(output, final_state, dtype, output_final_state)


def kimi_delta_rule(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, chunk_size: int,
    initial_state: torch.Tensor | None = None, output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Kimi's delta rule (a decay per head, token and key channel) over (batch, length,
    heads, dim) inputs, read in chunks as :func:`gated_delta_rule`."""
    dtype, length = query.dtype, key.shape[1]
    query, key, weighted_values, weighted_keys, g = _chunked_inputs(query, key, value, g, beta, chunk_size,
                                                                     use_qk_l2norm_in_kernel)
    decay_sums = g.cumsum(dim=-2)
    # exp of each channel's decay from position j to i of a chunk, for j <= i: (..., i, j, channel)
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=query.device).triu(1)
    pairwise = (decay_sums[..., :, None, :] - decay_sums[..., None, :, :]).masked_fill(upper[..., None], float("-inf")).exp()
    products = (weighted_keys[..., :, None, :] * key[..., None, :, :] * pairwise).sum(-1)
    solved = _unit_lower_inverse(torch.eye(chunk_size, device=query.device) + products.tril(-1))
    within = (query[..., :, None, :] * key[..., None, :, :] * pairwise).sum(-1).masked_fill(upper, 0.0)
    steps = [query * decay_sums.exp(), key * (decay_sums[..., -1:, :] - decay_sums).exp(), solved @ weighted_values,
             solved @ (weighted_keys * decay_sums.exp()), within, decay_sums[..., -1, :].exp()[..., None]]
    output, final_state = _scan_chunks(_start_state(initial_state, key, weighted_values), steps, length)
    return _final(output, final_state, dtype, output_final_state)


def _with_symbolic_chunks(rule: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` computed by ``rule`` in half chunks; packed sequences (``cu_seqlens``),
    which only the kernels keep apart, go to the original."""
    default = default_chunk(original) or 64

    def chunked_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     chunk_size: int = default, initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                     use_qk_l2norm_in_kernel: bool = False, **kwargs: Any) -> Any:
        if kwargs.get("cu_seqlens") is not None:
            return original(query, key, value, g=g, beta=beta, chunk_size=chunk_size, initial_state=initial_state,
                            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                            **kwargs)
        half_chunk = max(1, chunk_size // 2)  # the chunk of zeros costs a half chunk (see the module's notes)
        return rule(query, key, value, g, beta, half_chunk, initial_state, output_final_state, use_qk_l2norm_in_kernel)

    chunked_rule.__name__ = getattr(original, "__name__", chunked_rule.__name__)
    chunked_rule.__wrapped__ = original  # type: ignore[attr-defined]
    return chunked_rule


def delta_rule_with_symbolic_chunks(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch_chunk_gated_delta_rule`` computed by :func:`gated_delta_rule`."""
    return _with_symbolic_chunks(gated_delta_rule, original)


def kimi_rule_with_symbolic_chunks(original: Callable[..., Any]) -> Callable[..., Any]:
    """``chunk_kimi_delta_attention`` computed by :func:`kimi_delta_rule`."""
    return _with_symbolic_chunks(kimi_delta_rule, original)
