"""The scale (and zero point) of each block of a MatMulNBits weight, and its codes.

``rtn`` (round-to-nearest) fixes a block's scale from its extremes (symmetric: the
largest magnitude maps to the lowest code, as onnxruntime's quantizer does; asymmetric:
``[min, max]`` over the codes) and rounds every element to that grid: one outlier
stretches the grid for the whole block. ``search`` tries, for each block, a
set of candidate scales (the extreme-based one shrunk by a few factors, and mapped to the
highest code instead of the lowest), rounds the block to each exactly as the packing
does, and keeps the one with the smallest sum of squared errors; then it refits the
scale to the chosen codes by least squares (the k-quant idea: for fixed codes ``q`` the
best scale is ``sum(w q) / sum(q q)``) and keeps the refit where it lowers the error.

The round-to-nearest scale is one of the candidates and a candidate replaces it only
when strictly better, so no block's error is above round-to-nearest's; the codes come
from the same rounding (`round_codes`), so the error measured here is the error of the
codes written.
"""

from __future__ import annotations

import torch

from fx2onnx.options import QUANTIZATION_ALGORITHMS
# shrink factors of the extreme-based scale tried for every block (1.0 is round-to-nearest)
_SHRINK = (1.0, 0.97, 0.94, 0.91, 0.88, 0.85, 0.82, 0.79, 0.76, 0.73, 0.70)
# least-squares refits of the scale to the chosen codes
_REFITS = 2


def round_codes(matrix: torch.Tensor, scales: torch.Tensor, zero: torch.Tensor, top: int) -> torch.Tensor:
    """Float codes of ``matrix`` [rows, blocks, block_size] for a scale and a zero point per
    block, rounded as onnxruntime's quantizer rounds: ``v * (1 / scale) + zero_point`` in
    float32, half away from zero (C's roundf), clamped to ``[0, top]``; a zero scale gives
    the zero point."""
    safe = torch.where(scales == 0, torch.ones_like(scales), scales)
    codes = (matrix * (1.0 / safe)[..., None]).add_(zero[..., None])
    floor = codes.floor()
    codes = floor.add_(codes.sub_(floor).ge_(0.5))
    return torch.where(scales[..., None] == 0, zero[..., None], codes).clamp_(0, top)


def _rtn_symmetric(matrix: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scales, zero points, the signed extreme) of round-to-nearest's symmetric blocks."""
    largest, smallest = matrix.amax(-1), matrix.amin(-1)
    extreme = torch.where(largest.abs() > smallest.abs(), largest, smallest)
    middle = 2 ** (bits - 1)
    return extreme / -middle, torch.full_like(extreme, float(middle)), extreme


def _range_scales(low: torch.Tensor, high: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales and integer zero points mapping ``[low, high]`` (containing 0) over the codes."""
    top = 2**bits - 1
    scales = (high - low) / top
    safe = torch.where(scales == 0, torch.ones_like(scales), scales)
    zero = torch.where(scales == 0, torch.full_like(scales, 2.0 ** (bits - 1)), (-low / safe).round().clamp(0, top))
    return scales, zero


def block_scales(matrix: torch.Tensor, bits: int, symmetric: bool, algorithm: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales and zero points [rows, blocks] (float; the zero points integers) of
    ``matrix`` [rows, blocks, block_size] by ``algorithm`` (see the module docstring)."""
    if algorithm not in QUANTIZATION_ALGORITHMS:
        raise ValueError(f"weight quantization algorithm {algorithm!r}: one of {', '.join(QUANTIZATION_ALGORITHMS)}.")
    if algorithm == "search":
        return _search_symmetric(matrix, bits) if symmetric else _search_asymmetric(matrix, bits)
    if symmetric:
        return _rtn_symmetric(matrix, bits)[:2]
    return _range_scales(matrix.amin(-1).clamp(max=0.0), matrix.amax(-1).clamp(min=0.0), bits)


def _block_error(matrix: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    return ((codes - zero[..., None]) * scales[..., None] - matrix).square_().sum(-1)


def _keep_better(best: list[torch.Tensor], matrix: torch.Tensor, scales: torch.Tensor, zero: torch.Tensor,
                 top: int) -> None:
    """Replace, in the blocks where the candidate is strictly better, ``best`` (error,
    scales, zero points) by the candidate's."""
    error = _block_error(matrix, round_codes(matrix, scales, zero, top), scales, zero)
    better = error < best[0]
    best[0] = torch.where(better, error, best[0])
    best[1] = torch.where(better, scales, best[1])
    best[2] = torch.where(better, zero, best[2])


def _search_symmetric(matrix: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales [rows, blocks] (zero points all ``2 ** (bits - 1)``) of ``matrix``
    [rows, blocks, block_size] with the least squared error found (see the module docstring)."""
    middle, top = 2 ** (bits - 1), 2**bits - 1
    rtn, zero, extreme = _rtn_symmetric(matrix, bits)
    best = [_block_error(matrix, round_codes(matrix, rtn, zero, top), rtn, zero), rtn, zero]
    for shrink in _SHRINK:
        # the extreme on the lowest code (as round-to-nearest), or on the highest
        for scales in (rtn * shrink, extreme / (middle - 1) * shrink):
            _keep_better(best, matrix, scales, zero, top)
    for _ in range(_REFITS):
        centered = round_codes(matrix, best[1], zero, top) - zero[..., None]
        norm = centered.square().sum(-1)
        refit = torch.where(norm > 0, (matrix * centered).sum(-1) / norm.clamp(min=1e-30), best[1])
        _keep_better(best, matrix, refit, zero, top)
    return best[1], zero


def _search_asymmetric(matrix: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales and integer zero points [rows, blocks] of ``matrix`` [rows, blocks,
    block_size] with the least squared error found: the range ``[min, max]`` (taken to
    include 0, as round-to-nearest) shrunk from either end, then the least-squares refit
    of scale and offset to the chosen codes."""
    top = 2**bits - 1
    smallest = matrix.amin(-1).clamp(max=0.0)
    largest = matrix.amax(-1).clamp(min=0.0)
    scales, zero = _range_scales(smallest, largest, bits)
    best = [_block_error(matrix, round_codes(matrix, scales, zero, top), scales, zero), scales, zero]
    for low_shrink in _SHRINK:
        for high_shrink in _SHRINK[::2]:
            _keep_better(best, matrix, *_range_scales(smallest * low_shrink, largest * high_shrink, bits), top)
    for _ in range(_REFITS):
        # w ~ scale * codes + offset for the chosen codes; the offset becomes an integer zero point
        codes = round_codes(matrix, best[1], best[2], top)
        count = matrix.shape[-1]
        sum_q, sum_w = codes.sum(-1), matrix.sum(-1)
        sum_qq, sum_qw = codes.square().sum(-1), (codes * matrix).sum(-1)
        det = count * sum_qq - sum_q.square()
        scales = torch.where(det > 0, (count * sum_qw - sum_q * sum_w) / det.clamp(min=1e-30), best[1])
        offset = (sum_w - scales * sum_q) / count
        safe = torch.where(scales == 0, torch.ones_like(scales), scales)
        zero = torch.where(scales == 0, best[2], (-offset / safe).round().clamp(0, top))
        _keep_better(best, matrix, scales, zero, top)
    return best[1], best[2]
