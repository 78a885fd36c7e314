"""ONNX types of the things an FX node passes to an ONNX function.

Complex tensors are represented as real tensors with a trailing dimension of 2, so
``complex64`` maps to FLOAT and ``complex128`` to DOUBLE. SymInt, SymFloat and SymBool
values are 0-d INT64, FLOAT and BOOL tensors.
"""

from __future__ import annotations

import onnx_ir as ir
import torch

_TORCH_TO_ONNX: dict[torch.dtype, ir.DataType] = {
    torch.bool: ir.DataType.BOOL,
    torch.uint8: ir.DataType.UINT8,
    torch.int8: ir.DataType.INT8,
    torch.int16: ir.DataType.INT16,
    torch.int32: ir.DataType.INT32,
    torch.int64: ir.DataType.INT64,
    torch.uint16: ir.DataType.UINT16,
    torch.uint32: ir.DataType.UINT32,
    torch.uint64: ir.DataType.UINT64,
    torch.float16: ir.DataType.FLOAT16,
    torch.bfloat16: ir.DataType.BFLOAT16,
    torch.float32: ir.DataType.FLOAT,
    torch.float64: ir.DataType.DOUBLE,
    torch.float8_e4m3fn: ir.DataType.FLOAT8E4M3FN,
    torch.float8_e4m3fnuz: ir.DataType.FLOAT8E4M3FNUZ,
    torch.float8_e5m2: ir.DataType.FLOAT8E5M2,
    torch.float8_e5m2fnuz: ir.DataType.FLOAT8E5M2FNUZ,
    torch.float8_e8m0fnu: ir.DataType.FLOAT8E8M0,
    torch.float4_e2m1fn_x2: ir.DataType.FLOAT4E2M1,
    torch.int4: ir.DataType.INT4,
    torch.uint4: ir.DataType.UINT4,
    torch.int2: ir.DataType.INT2,
    torch.uint2: ir.DataType.UINT2,
    # Complex tensors travel as real tensors of their component type (trailing dim 2).
    torch.complex32: ir.DataType.FLOAT16,
    torch.complex64: ir.DataType.FLOAT,
    torch.complex128: ir.DataType.DOUBLE,
    # Quantized tensors carry their integer representation.
    torch.qint8: ir.DataType.INT8,
    torch.quint8: ir.DataType.UINT8,
    torch.qint32: ir.DataType.INT32,
}


def torch_dtype_to_onnx(dtype: torch.dtype) -> ir.DataType:
    """The ONNX element type of a torch dtype (complex -> its real component type).

    >>> torch_dtype_to_onnx(torch.float32).name
    'FLOAT'
    >>> torch_dtype_to_onnx(torch.complex128).name
    'DOUBLE'
    """
    try:
        return _TORCH_TO_ONNX[dtype]
    except (KeyError, TypeError):
        raise ValueError(
            f"{dtype!r} has no ONNX element type; supported torch dtypes: "
            f"{', '.join(sorted(str(d) for d in _TORCH_TO_ONNX))}."
        ) from None


# Kinds of Python scalars, ordered so that a narrower kind converts to a wider one the way
# PyTorch's scalar arguments do: a bool is an int, an int is a float.
BOOL_TYPES = frozenset({ir.DataType.BOOL})
INT_TYPES = frozenset(
    {
        ir.DataType.INT8,
        ir.DataType.INT16,
        ir.DataType.INT32,
        ir.DataType.INT64,
        ir.DataType.UINT8,
        ir.DataType.UINT16,
        ir.DataType.UINT32,
        ir.DataType.UINT64,
    }
)
FLOAT_TYPES = frozenset(
    {ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16}
)


def scalar_kind(value: object) -> str | None:
    """"bool", "int", "float", "complex" or "string" for a Python scalar, else None."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, complex):
        return "complex"
    if isinstance(value, str):
        return "string"
    return None


def element_types_for_kind(kind: str) -> frozenset[ir.DataType]:
    """The ONNX element types a Python scalar of ``kind`` may become."""
    if kind == "bool":
        return BOOL_TYPES | INT_TYPES | FLOAT_TYPES
    if kind == "int":
        return INT_TYPES | FLOAT_TYPES
    if kind == "string":
        return frozenset({ir.DataType.STRING})
    # float, and complex (a pair of reals)
    return FLOAT_TYPES


def wider_kind(a: str | None, b: str) -> str:
    order = ("bool", "int", "float", "complex", "string")
    if a is None:
        return b
    return a if order.index(a) >= order.index(b) else b


def symbolic_scalar_type(value: object) -> ir.DataType | None:
    """The 0-d tensor type of a SymInt/SymFloat/SymBool (or plain scalar) node value."""
    if isinstance(value, (torch.SymBool, bool)):
        return ir.DataType.BOOL
    if isinstance(value, (torch.SymInt, int)):
        return ir.DataType.INT64
    if isinstance(value, (torch.SymFloat, float)):
        return ir.DataType.FLOAT
    return None


def is_complex_value(value: object) -> bool:
    """Whether a node's ``meta["val"]`` is (or holds) a complex tensor."""
    if isinstance(value, torch.Tensor):
        return value.is_complex()
    if isinstance(value, (list, tuple)):
        return any(is_complex_value(v) for v in value)
    return False


def is_float_value(value: object) -> bool:
    """Whether a traced value (anything with an ONNX ``dtype``) holds real floating numbers."""
    return getattr(value, "dtype", None) in FLOAT_TYPES
