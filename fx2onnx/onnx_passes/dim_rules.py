"""Rewrite rules for dims read from a shape: a dim is a one-element 1-D tensor
(``Shape(x, start=i, end=i+1)``), squeezed to a scalar where PyTorch holds a SymInt. Where
the scalar is made a one-element tensor again (the scalar may have other uses: it stays
for them) (``Reshape(..., [1])`` or
``Unsqueeze(..., [0])``, to build a shape), the dim is used as it was read.

Two nodes fewer per use, and a form TVM's ONNX frontend takes: it reads the squeezed dim,
and arithmetic on it, as a scalar of its shape language (``PrimValue``), which its
``Reshape`` refuses. For the same reason any other scalar made a one-element tensor is
unsqueezed rather than reshaped (the same node count; TVM's ``Unsqueeze`` takes scalars).
"""

from __future__ import annotations

import onnx_ir as ir


def _is_one_element_dim(value: ir.Value) -> bool:
    return value.shape is not None and value.shape.rank() == 1 and value.shape[0] == 1


def _constant_list(value: ir.Value) -> list[int] | None:
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else [int(x) for x in tensor.numpy().reshape(-1)]


def _reshaped(op, dim, shape):
    return op.Reshape(op.Squeeze(dim), shape)


def _unsqueezed(op, dim, axes):
    return op.Unsqueeze(op.Squeeze(dim), axes)


def _dim_as_read(op, dim, **_):
    return op.Identity(dim)


def _reshaped_to_one_element(context, dim, shape) -> bool:
    return _is_one_element_dim(dim) and _constant_list(shape) in ([1], [-1])


def _unsqueezed_at_zero(context, dim, axes) -> bool:
    return _is_one_element_dim(dim) and _constant_list(axes) in ([0], [-1])


def _scalar_reshaped(op, scalar, shape):
    return op.Reshape(scalar, shape)


def _scalar_unsqueezed(op, scalar, shape):
    return op.Unsqueeze(scalar, op.Constant(value_ints=[0]))


def _scalar_to_one_element(context, scalar, shape) -> bool:
    return scalar.shape is not None and scalar.shape.rank() == 0 and _constant_list(shape) in ([1], [-1])


def dim_rules() -> list:
    """The rules (onnxscript `RewriteRule`s) that use a dim as it was read."""
    from onnxscript.rewriter import RewriteRule

    return [
        RewriteRule(_reshaped, _dim_as_read, _reshaped_to_one_element, name="DimReshapedBack", remove_nodes=False),
        RewriteRule(_unsqueezed, _dim_as_read, _unsqueezed_at_zero, name="DimUnsqueezedBack", remove_nodes=False),
        RewriteRule(_scalar_reshaped, _scalar_unsqueezed, _scalar_to_one_element, name="ScalarUnsqueezed"),
    ]
