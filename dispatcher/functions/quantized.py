"""Weights stored quantized: torchao's ``dequantize_affine`` and the weight-only linear
layer the FX pass makes of it (``fx2onnx/fx_passes/quantized_weights.py``).

``fx2onnx::weight_only_linear`` is onnxruntime's ``MatMulNBits``: its weight is packed from
the stored integers by ONNX operators on initializers (shift to unsigned, two 4-bit
values a byte, the low nibble first; scales and zero points repeated where the kernel's
block is smaller than the model's group), which onnxruntime folds when it loads the model.
So the file keeps the model's own tensors (one byte a weight) and the model in memory
holds only the packed integers. The bytes are those of the one MatMulNBits layout,
``fx2onnx/onnx_passes/nbits_packing.py`` (`pack_codes` for the same codes; a test
compares them). Accuracy level 0: the kernel dequantizes and multiplies
in float, as the PyTorch model does.

``torchao::dequantize_affine`` of a matrix in blocks of rows and columns is
``(qdata - zero_point) * scale`` with each scale repeated over its block, in float.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import onnx_ir as ir
from onnxscript import opset18 as op
from onnxscript import values as osv

from dispatcher.function_table import FunctionTable

__all__ = ["QUANTIZED_FUNCTIONS", "QUANTIZED_DOMAIN"]

QUANTIZED_DOMAIN = "pkg.fx2onnx.quantized"
_TABLE = FunctionTable(QUANTIZED_DOMAIN)
QUANTIZED_FUNCTIONS = _TABLE.entries

_matmul_nbits = osv.Op(osv.Opset("com.microsoft", 1), "MatMulNBits")
# block sizes onnxruntime's MatMulNBits kernels run, largest first
_KERNEL_BLOCKS = (256, 128, 64, 32, 16)
_INT32, _UINT8, _FLOAT = ir.DataType.INT32.value, ir.DataType.UINT8.value, ir.DataType.FLOAT.value


def _ints(values: Sequence[int]) -> Any:
    return op.Constant(value_ints=list(values))


def kernel_block(group_size: int) -> int | None:
    """The largest block MatMulNBits runs that divides ``group_size``."""
    return next((block for block in _KERNEL_BLOCKS if group_size % block == 0), None)


def _int32(value: int) -> Any:
    return op.Cast(op.Constant(value_int=value), to=_INT32)


def _unsigned(integers: Any, bits: int) -> Any:
    """Signed ``bits``-bit integers as the unsigned bytes MatMulNBits reads (x + 2**(bits-1))."""
    return op.Add(op.Cast(integers, to=_INT32), _int32(2 ** (bits - 1)))


def _nibbles_packed(values: Any, rows: int, count: int) -> Any:
    """int32 values in [0, 16), (rows, count) with count even, as (rows, count / 2) bytes:
    the even positions in the low nibble."""
    pairs = op.Reshape(values, _ints([rows, count // 2, 2]))
    low = op.Slice(pairs, _ints([0]), _ints([1]), _ints([2]))
    high = op.Slice(pairs, _ints([1]), _ints([2]), _ints([2]))
    packed = op.Add(low, op.Mul(high, _int32(16)))
    return op.Cast(op.Reshape(packed, _ints([rows, count // 2])), to=_UINT8)


def _per_block(values: Any, rows: int, groups: int, repeat: int) -> Any:
    """(rows, groups) values, each repeated ``repeat`` times along the row."""
    if repeat == 1:
        return values
    spread = op.Expand(op.Unsqueeze(values, _ints([2])), _ints([rows, groups, repeat]))
    return op.Reshape(spread, _ints([rows, groups * repeat]))


@_TABLE.op("fx2onnx::weight_only_linear")
def weight_only_linear(
    x: Any, qdata: Any, scale: Any, zero_point: Optional[Any] = None, bias: Optional[Any] = None,
    group_size: int = 32, bits: int = 4,
) -> Any:
    rows, features = int(qdata.shape[0]), int(qdata.shape[1])
    block = kernel_block(group_size)
    assert block is not None, "checked by the FX pass"
    blocks, repeat = features // block, group_size // block
    unsigned = _unsigned(qdata, bits)
    if bits == 4:
        packed = _nibbles_packed(unsigned, rows, features)
        weight = op.Reshape(packed, _ints([rows, blocks, block // 2]))
    else:
        weight = op.Reshape(op.Cast(unsigned, to=_UINT8), _ints([rows, blocks, block]))
    scales = op.Reshape(op.CastLike(_per_block(scale, rows, features // group_size, repeat), x), _ints([-1]))
    inputs = [x, weight, scales]
    if zero_point is not None:
        zeros = _unsigned(_per_block(zero_point, rows, features // group_size, repeat), bits)
        if bits == 4:
            if blocks % 2:  # each row's zero points fill whole bytes
                zeros = op.Pad(zeros, _ints([0, 0, 0, 1]))
            zeros = _nibbles_packed(zeros, rows, blocks + blocks % 2)
        else:
            zeros = op.Cast(zeros, to=_UINT8)
        inputs.append(op.Reshape(zeros, _ints([-1])))
    result = _matmul_nbits(*inputs, K=features, N=rows, bits=bits, block_size=block, accuracy_level=0)
    return result if bias is None else op.Add(result, bias)


@_TABLE.op("torchao::dequantize_affine")
def dequantize_affine(
    input: Any, block_size: Sequence[int], scale: Any, zero_point: Optional[Any] = None, input_dtype: int = 0,
    quant_min: Optional[float] = None, quant_max: Optional[float] = None, output_dtype: int = _FLOAT,
) -> Any:
    # dtypes arrive as ONNX types (the interpreter converts torch dtypes)
    rows, columns = int(input.shape[0]), int(input.shape[1])
    block_rows, block_columns = int(block_size[0]), int(block_size[1])
    # (rows / br, br, columns / bc, bc) blocks, one scale (and zero point) each
    blocked = op.Reshape(op.Cast(input, to=_FLOAT), _ints([rows // block_rows, block_rows, columns // block_columns, block_columns]))
    per_block = _ints([rows // block_rows, 1, columns // block_columns, 1])
    if zero_point is not None:
        blocked = op.Sub(blocked, op.Reshape(op.Cast(zero_point, to=_FLOAT), per_block))
    dequantized = op.Mul(blocked, op.Reshape(op.Cast(scale, to=_FLOAT), per_block))
    return op.Cast(op.Reshape(dequantized, _ints([rows, columns])), to=output_dtype)
