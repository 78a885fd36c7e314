"""Block-wise weight quantization in the layout of onnxruntime's ``com.microsoft.MatMulNBits``.

``MatMulNBits(A, B, scales[, zero_points])`` computes ``A @ W`` for a weight ``W`` of
shape ``[K, N]`` kept as integer codes along K, in blocks of ``block_size`` rows:

- ``B``: uint8 ``[N, k_blocks, blob_size]`` with ``k_blocks = ceil(K / block_size)`` and
  ``blob_size = block_size * bits / 8``: column ``n`` of W (a row of PyTorch's
  ``[out, in]`` weight), block by block; 4-bit codes two to a byte, the even element in
  the low nibble. K is padded with zeros up to whole blocks.
- ``scales``: ``[N * k_blocks]``, in the dtype of ``A``.
- ``zero_points``: uint8, ``[N * ceil(k_blocks * bits / 8)]`` (4-bit ones two to a byte,
  low nibble first, each row of N padded to whole bytes); absent, every block's zero
  point is ``2 ** (bits - 1)`` (8 for 4 bits, 128 for 8 bits): symmetric quantization.

The weight is ``(code - zero_point) * scale``. Symmetric blocks map the element of
largest magnitude to the lowest code, as onnxruntime's own quantizer does: the scale is
``extreme / -2 ** (bits - 1)``, so that the full range ``[-2 ** (bits - 1), 2 ** (bits - 1) - 1]``
is used. Everything is computed in float32 with torch, one weight at a time, in the order
and with the rounding of onnxruntime's quantizer, so that the codes are its codes byte for byte.

`lay_out_codes` is the one layout: `pack_weight` lays out the codes it computes with it,
`pack_codes` the codes a model already holds (torchao's weight-only tensors), and the
ONNX operators that pack torchao's weights inside the graph
(``dispatcher/functions/quantized.py``) compute the same bytes, which onnxruntime folds
when it loads the model (a test compares the two).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fx2onnx.onnx_passes.block_scales import block_scales, round_codes

@dataclass(frozen=True)
class PackedWeight:
    """One weight in MatMulNBits' inputs (see the module docstring)."""

    codes: torch.Tensor  # uint8 [N, k_blocks, blob_size]
    scales: torch.Tensor  # float32 [N * k_blocks]
    zero_points: torch.Tensor | None  # uint8 [N * ceil(k_blocks * bits / 8)], None when symmetric


def block_count(k: int, block_size: int) -> int:
    return (k + block_size - 1) // block_size


def packed_shapes(n: int, k: int, bits: int, block_size: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The shapes of B, scales and zero_points for a weight of ``N`` columns and ``K`` rows."""
    blocks = block_count(k, block_size)
    return (n, blocks, block_size * bits // 8), (n * blocks,), (n * ((blocks * bits + 7) // 8),)


def _pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Pairs of 4-bit codes along the last dim into one byte, the first in the low nibble."""
    if codes.shape[-1] % 2:
        codes = torch.nn.functional.pad(codes, (0, 1))
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def lay_out_codes(codes: torch.Tensor, zero: torch.Tensor | None, bits: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Unsigned codes ``[N, k_blocks, block_size]`` and zero points ``[N, k_blocks]`` (uint8
    values below ``2 ** bits``) as MatMulNBits' ``B`` and its zero points, both still
    ``N`` rows (flatten the zero points for the input)."""
    if bits == 4:
        return _pack_nibbles(codes), None if zero is None else _pack_nibbles(zero)
    return codes, zero


def pack_codes(
    codes: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None, bits: int, block_size: int
) -> PackedWeight:
    """Signed codes ``[N, K]`` a model already holds, with a scale (and zero point) per
    group of ``K`` (``[N, groups]``, groups a multiple of ``block_size`` long), as
    MatMulNBits' inputs: the unsigned codes ``code + 2 ** (bits - 1)``, each group's
    scale and zero point repeated over the blocks it spans."""
    n, k = codes.shape
    if k % block_size:
        raise ValueError(f"K ({k}) is not a whole number of blocks of {block_size}.")
    blocks, offset = k // block_size, 2 ** (bits - 1)
    repeat = blocks // scales.shape[1]
    unsigned = (codes.to(torch.int32) + offset).to(torch.uint8).reshape(n, blocks, block_size)
    zero = None
    if zero_points is not None:
        zero = (zero_points.to(torch.int32) + offset).to(torch.uint8).repeat_interleave(repeat, dim=1)
    packed, packed_zero = lay_out_codes(unsigned, zero, bits)
    scales = scales.to(torch.float32).repeat_interleave(repeat, dim=1).reshape(-1)
    return PackedWeight(packed, scales, None if packed_zero is None else packed_zero.reshape(-1))


# Rows quantized at a time: the float temporaries stay a few tens of MB whatever the
# weight's size (a 7B model's LM head is 131M elements), the outputs are written in place.
_CHUNK_ELEMENTS = 2**22


def pack_weight(
    weight: torch.Tensor, bits: int, block_size: int, symmetric: bool = True, algorithm: str = "rtn"
) -> PackedWeight:
    """Quantize ``weight`` given as ``[N, K]`` (PyTorch's ``[out, in]`` layout of a linear
    layer, i.e. the transpose of what MatMul reads) block-wise along K, with each block's
    scale from its extremes (``algorithm="rtn"``) or searched for the least squared error
    (``"search"``, `block_scales`)."""
    if bits not in (4, 8):
        raise ValueError(f"MatMulNBits weights are packed with 4 or 8 bits, not {bits}.")
    if weight.dim() != 2:
        raise ValueError(f"a MatMulNBits weight is a matrix; got shape {tuple(weight.shape)}.")
    n, k = weight.shape
    codes_shape, scales_shape, zero_shape = packed_shapes(n, k, bits, block_size)
    codes = torch.empty(codes_shape, dtype=torch.uint8)
    scales = torch.empty(scales_shape, dtype=torch.float32).reshape(n, -1)
    zero_points = None if symmetric else torch.empty(zero_shape, dtype=torch.uint8).reshape(n, -1)
    step = max(1, _CHUNK_ELEMENTS // max(k, 1))
    for start in range(0, n, step):
        rows = slice(start, min(n, start + step))
        chunk_codes, chunk_scales, chunk_zero = _pack_rows(weight[rows], bits, block_size, symmetric, algorithm)
        codes[rows], scales[rows] = chunk_codes, chunk_scales
        if zero_points is not None:
            zero_points[rows] = chunk_zero
    return PackedWeight(codes, scales.reshape(-1), None if zero_points is None else zero_points.reshape(-1))


def _pack_rows(
    weight: torch.Tensor, bits: int, block_size: int, symmetric: bool, algorithm: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes [rows, k_blocks, blob_size], scales [rows, k_blocks] and packed zero points
    [rows, ceil(k_blocks * bits / 8)] of some rows of a weight."""
    matrix = _blocks(weight, block_size)
    scales, zero = block_scales(matrix, bits, symmetric, algorithm)
    codes = round_codes(matrix, scales, zero, 2**bits - 1).to(torch.uint8)
    packed, packed_zero = lay_out_codes(codes, zero.to(torch.uint8), bits)
    assert packed_zero is not None
    return packed, scales, packed_zero


def _blocks(weight: torch.Tensor, block_size: int) -> torch.Tensor:
    """``weight`` [N, K] in float32 as [N, k_blocks, block_size], K padded with zeros."""
    n, k = weight.shape
    blocks = block_count(k, block_size)
    matrix = weight.detach().to(torch.float32)
    if blocks * block_size != k:
        matrix = torch.nn.functional.pad(matrix, (0, blocks * block_size - k))
    return matrix.reshape(n, blocks, block_size)


def rounded_weight(
    weight: torch.Tensor, bits: int, block_size: int, symmetric: bool = True, algorithm: str = "rtn"
) -> torch.Tensor:
    """``weight`` [N, K] as `pack_weight`'s codes give it back (``(code - zero_point) * scale``),
    in its own dtype: the weight a MatMulNBits of these settings computes with."""
    n, k = weight.shape
    matrix = _blocks(weight, block_size)
    scales, zero = block_scales(matrix, bits, symmetric, algorithm)
    codes = round_codes(matrix, scales, zero, 2**bits - 1)
    return ((codes - zero[..., None]) * scales[..., None]).reshape(n, -1)[:, :k].to(weight.dtype)
