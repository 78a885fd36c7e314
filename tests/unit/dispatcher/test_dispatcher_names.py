"""Qualified operator names and the torch dtype -> ONNX type table."""

from __future__ import annotations

import math
import operator

import onnx_ir as ir
import pytest
import torch

from dispatcher import OpName, normalize_qualified_name, qualified_name_of, torch_dtype_to_onnx


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (torch.ops.aten.add.Tensor, "aten::add.Tensor"),
        (torch.ops.aten.relu.default, "aten::relu"),
        (torch.ops.aten.sym_size.int, "aten::sym_size.int"),
        (torch.ops.aten.sym_size, "aten::sym_size"),  # a packet stands for its default
        (torch.ops.prims.convert_element_type.default, "prims::convert_element_type"),
        (operator.add, "_operator::add"),
        (operator.floordiv, "_operator::floordiv"),
        (operator.and_, "_operator::and_"),
        (operator.getitem, "_operator::getitem"),
        (math.ceil, "math::ceil"),
        (math.sqrt, "math::sqrt"),
        (torch.sym_max, "torch::sym_max"),
        (torch.ops.higher_order.cond, "higher_order::cond"),
    ],
)
def test_qualified_name_of(target, expected):
    assert qualified_name_of(target) == expected


@pytest.mark.parametrize(
    "target",
    [lambda x: x + 1, "aten::add", 3, torch.nn.functional.relu],
    ids=["lambda", "string", "int", "python_function"],
)
def test_qualified_name_of_rejects_other_targets_and_names_them(target):
    with pytest.raises(ValueError, match="Cannot name the call_function target") as info:
        qualified_name_of(target)
    if callable(target):
        assert getattr(target, "__name__") in str(info.value)


def test_default_overload_is_one_key_either_way():
    assert normalize_qualified_name("aten::relu.default") == "aten::relu"
    assert normalize_qualified_name("aten::relu") == "aten::relu"
    assert OpName.from_parts("aten", "relu", None) == OpName.from_parts("aten", "relu", "")
    assert OpName.from_parts("aten", "relu", "default").qualified_name() == "aten::relu"
    assert OpName.parse("aten::add.Tensor") == OpName("aten", "add", "Tensor")
    assert OpName.parse("aten::add.Tensor").default().qualified_name() == "aten::add"


@pytest.mark.parametrize("bad", ["add", "::add", "aten::"])
def test_opname_parse_rejects_malformed_names(bad):
    with pytest.raises(ValueError):
        OpName.parse(bad)


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (torch.bool, ir.DataType.BOOL),
        (torch.uint8, ir.DataType.UINT8),
        (torch.int8, ir.DataType.INT8),
        (torch.int16, ir.DataType.INT16),
        (torch.int32, ir.DataType.INT32),
        (torch.int64, ir.DataType.INT64),
        (torch.uint16, ir.DataType.UINT16),
        (torch.uint32, ir.DataType.UINT32),
        (torch.uint64, ir.DataType.UINT64),
        (torch.float16, ir.DataType.FLOAT16),
        (torch.bfloat16, ir.DataType.BFLOAT16),
        (torch.float32, ir.DataType.FLOAT),
        (torch.float64, ir.DataType.DOUBLE),
        (torch.float8_e4m3fn, ir.DataType.FLOAT8E4M3FN),
        (torch.float8_e4m3fnuz, ir.DataType.FLOAT8E4M3FNUZ),
        (torch.float8_e5m2, ir.DataType.FLOAT8E5M2),
        (torch.float8_e5m2fnuz, ir.DataType.FLOAT8E5M2FNUZ),
        (torch.float8_e8m0fnu, ir.DataType.FLOAT8E8M0),
        (torch.complex64, ir.DataType.FLOAT),
        (torch.complex128, ir.DataType.DOUBLE),
        (torch.complex32, ir.DataType.FLOAT16),
    ],
)
def test_torch_dtype_to_onnx(dtype, expected):
    assert torch_dtype_to_onnx(dtype) == expected


def test_every_common_torch_dtype_has_an_onnx_type():
    for name in ("float", "double", "half", "long", "int", "short", "bool", "cfloat", "cdouble"):
        assert isinstance(torch_dtype_to_onnx(getattr(torch, name)), ir.DataType)


def test_torch_dtype_to_onnx_rejects_unknown_dtypes():
    with pytest.raises(ValueError, match="no ONNX element type"):
        torch_dtype_to_onnx(torch.uint7)
    with pytest.raises(ValueError, match="no ONNX element type"):
        torch_dtype_to_onnx("float32")  # type: ignore[arg-type]
