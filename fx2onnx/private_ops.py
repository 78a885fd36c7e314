"""PyTorch operators that fx2onnx names and that PyTorch may rename or remove (private
`aten._*` ops and ops a pass treats specially), looked up here, lazily, in one place.

A name that no longer resolves is left out (so `import fx2onnx` and exports keep
working); `missing_private_ops()` lists such names, and the test suite fails on any.

>>> torch_op("aten.relu.default")
<OpOverload(op='aten.relu', overload='default')>
>>> torch_op("aten.no_such_op.default") is None
True
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import torch

# Runtime assertions: they check metadata, symbolic ranges or linear-algebra success.
ASSERTION_OP_NAMES = (
    "aten._assert_tensor_metadata.default",
    "aten._assert_scalar.default",
    "aten._assert_async.default",
    "aten._assert_async.msg",
    "aten.sym_constrain_range.default",
    "aten.sym_constrain_range_for_size.default",
    "aten._functional_assert_async.msg",
    "aten._functional_sym_constrain_range.default",
    "aten._functional_sym_constrain_range_for_size.default",
    "aten._linalg_check_errors.default",  # raises on singular input in PyTorch
)

# Batch norm overloads with a `training` flag, and its argument position.
TRAINING_BATCH_NORM_NAMES = {
    "aten._native_batch_norm_legit_functional.default": 5,
    "aten.native_batch_norm.default": 5,
    "aten._native_batch_norm_legit.default": 5,
}


# The wrapper torch.export puts around operators with side effects (effect tokens).
WITH_EFFECTS_NAME = "higher_order.with_effects"


# How torch.export reads the inner tensors of a tensor-subclass weight.
SUBCLASS_INNER_TENSOR_NAME = "export.access_subclass_inner_tensor.default"


# torch's map operator: a function applied along the leading dim (an ONNX Scan), which
# capture rewrites use for loops over a count known at run time.
MAP_FUNCTION_NAME = "torch._higher_order_ops.map.map"
# torch's scan operator: a recurrence along a dim whose length is known at run time (an ONNX Scan).
SCAN_FUNCTION_NAME = "torch._higher_order_ops.scan.scan"


def torch_function(name: str) -> Any:
    """The Python object ``module.attribute``, or None when this PyTorch has none."""
    module, _, attribute = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError):
        return None


@functools.cache
def map_function() -> Any:
    return torch_function(MAP_FUNCTION_NAME)


@functools.cache
def scan_function() -> Any:
    return torch_function(SCAN_FUNCTION_NAME)


def torch_op(name: str) -> Any:
    """The operator overload ``namespace.op.overload`` (`aten.add.Tensor`) or operator
    ``namespace.op`` (`higher_order.cond`), or None when this PyTorch has no such operator."""
    namespace, op_name, *overload = name.split(".")
    try:
        op = getattr(getattr(torch.ops, namespace), op_name)
        return getattr(op, overload[0]) if overload else op
    except (AttributeError, RuntimeError):
        return None


@functools.cache
def assertion_ops() -> frozenset[Any]:
    return frozenset(op for op in map(torch_op, ASSERTION_OP_NAMES) if op is not None)


@functools.cache
def training_batch_norm_ops() -> dict[Any, int]:
    """Overload -> position of its `training` argument."""
    return {op: position for name, position in TRAINING_BATCH_NORM_NAMES.items() if (op := torch_op(name)) is not None}


@functools.cache
def with_effects_op() -> Any:
    return torch_op(WITH_EFFECTS_NAME)


@functools.cache
def subclass_inner_tensor_op() -> Any:
    return torch_op(SUBCLASS_INNER_TENSOR_NAME)


def missing_private_ops() -> list[str]:
    """Names above that this PyTorch no longer resolves."""
    names = [*ASSERTION_OP_NAMES, *TRAINING_BATCH_NORM_NAMES, WITH_EFFECTS_NAME, SUBCLASS_INNER_TENSOR_NAME]
    missing = [name for name in names if torch_op(name) is None]
    missing += [MAP_FUNCTION_NAME] if map_function() is None else []
    return missing + ([SCAN_FUNCTION_NAME] if scan_function() is None else [])
