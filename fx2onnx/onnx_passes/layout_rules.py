"""Rewrite rules that take copies of data out of layout changes.

PyTorch code reshapes and transposes freely because most of it is free in eager mode
(views); in ONNX every Transpose is a copy. The rules here move a Transpose past the
Squeeze or the Gather that reads it, where the Transpose then vanishes:

- ``Squeeze(Unsqueeze(x, axes), axes)`` is ``x``;
- ``Squeeze(Transpose(x, perm), axes)`` is ``Transpose(Squeeze(x, perm[axes]), perm')``
  (the same copy, on a tensor without the size-1 axes; the Transpose disappears when
  ``perm'`` keeps the order, and the Squeeze may meet an Unsqueeze above it);
- ``Gather(Transpose(x, perm), i, axis=a)`` with a scalar index is
  ``Gather(x, i, axis=perm[a])`` when the remaining axes keep their order: the Transpose
  is gone for that Gather, and once every reader is rewritten, gone entirely.

The packed query/key/value projection of ``nn.MultiheadAttention`` (in every
``nn.Transformer*`` layer) is written ``unflatten, unsqueeze(0), transpose(0, -2),
squeeze(-2)`` and three selects: with these rules the whole projection output is no
longer transposed before being cut into its three parts.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase


def _constant_ints(value: ir.Value | None) -> list[int] | None:
    if value is None or value.const_value is None:
        return None
    return [int(item) for item in value.const_value.numpy().reshape(-1)]


def _rank(value: ir.Value) -> int | None:
    return None if value.shape is None else len(value.shape)


def _normalized(axes: Sequence[int], rank: int) -> list[int] | None:
    result = sorted(axis + rank if axis < 0 else axis for axis in axes)
    if any(axis < 0 or axis >= rank for axis in result) or len(set(result)) != len(result):
        return None
    return result


def _without_axes(perm: Sequence[int], removed_positions: Sequence[int]) -> list[int]:
    """``perm`` after the output axes at ``removed_positions`` (and the input axes they
    came from) are dropped, renumbered to the remaining input axes."""
    removed_inputs = sorted(perm[position] for position in removed_positions)
    kept = [axis for position, axis in enumerate(perm) if position not in removed_positions]
    return [axis - sum(1 for removed in removed_inputs if removed < axis) for axis in kept]


def _int64s(op, values: Sequence[int]) -> ir.Value:
    return op.Constant(value=ir.tensor(list(values), dtype=ir.DataType.INT64))


class SqueezeOfUnsqueeze(RewriteRuleClassBase):
    """``Squeeze(Unsqueeze(x, axes), axes)`` is ``x``."""

    def pattern(self, op, x, inserted, removed):
        return op.Squeeze(op.Unsqueeze(x, inserted), removed)

    def check(self, context, x: ir.Value, inserted: ir.Value, removed: ir.Value, **_) -> MatchResult:
        result = MatchResult()
        rank, inserted_axes, removed_axes = _rank(x), _constant_ints(inserted), _constant_ints(removed)
        if rank is None or inserted_axes is None or removed_axes is None:
            return result.fail("Rank or axes unknown.")
        output_rank = rank + len(inserted_axes)
        first, second = _normalized(inserted_axes, output_rank), _normalized(removed_axes, output_rank)
        if first is None or first != second:
            return result.fail("Different axes.")
        return result

    def rewrite(self, op, x: ir.Value, **_):
        return x


class SqueezeOfTranspose(RewriteRuleClassBase):
    """``Squeeze(Transpose(x, perm), axes)`` as ``Transpose(Squeeze(x, perm[axes]), perm')``."""

    def pattern(self, op, x, perm, axes):
        return op.Squeeze(op.Transpose(x, perm=perm), axes)

    def check(self, context, x: ir.Value, perm: ir.Attr, axes: ir.Value, **_) -> MatchResult:
        result = MatchResult()
        axes_ints = _constant_ints(axes)
        if perm.is_ref() or _rank(x) is None or axes_ints is None:
            return result.fail("Permutation, rank or axes unknown.")
        if _normalized(axes_ints, len(perm.as_ints())) is None:
            return result.fail("Axes out of range.")
        return result

    def rewrite(self, op, x: ir.Value, perm: ir.Attr, axes: ir.Value, **_):
        order = list(perm.as_ints())
        positions = _normalized(_constant_ints(axes), len(order))
        squeezed = op.Squeeze(x, _int64s(op, sorted(order[position] for position in positions)))
        remaining = _without_axes(order, positions)
        if remaining == sorted(remaining):
            return squeezed
        squeezed.dtype = x.dtype
        if x.shape is not None:
            dropped = {order[position] for position in positions}
            squeezed.shape = ir.Shape([dim for axis, dim in enumerate(x.shape) if axis not in dropped])
        return op.Transpose(squeezed, perm=remaining)


class GatherOfTranspose(RewriteRuleClassBase):
    """``Gather(Transpose(x, perm), i, axis=a)`` with a scalar ``i`` as ``Gather(x, i,
    axis=perm[a])`` when the other axes keep their order. The Transpose may have other
    readers: it stays for them (and is removed when it has none left)."""

    def __init__(self) -> None:
        super().__init__(remove_nodes=False)  # other readers may keep the Transpose

    def pattern(self, op, x, perm, index):
        return op.Gather(op.Transpose(x, perm=perm), index, _allow_other_attributes=True, _outputs=["gathered"])

    @staticmethod
    def _gathered_position(perm: ir.Attr, gathered: ir.Value) -> int:
        """The Gather's axis, counted from 0, in the Transpose's output."""
        axis = gathered.producer().attributes.get_int("axis", 0)
        return axis + len(perm.as_ints()) if axis < 0 else axis

    def check(self, context, x: ir.Value, perm: ir.Attr, index: ir.Value, gathered: ir.Value, **_) -> MatchResult:
        result = MatchResult()
        if perm.is_ref() or index.shape is None or len(index.shape) != 0:
            return result.fail("Not a scalar index of a known permutation.")
        order, position = list(perm.as_ints()), self._gathered_position(perm, gathered)
        if not 0 <= position < len(order):
            return result.fail("Axis out of range.")
        remaining = _without_axes(order, [position])
        if remaining != sorted(remaining):
            return result.fail("The other axes would still need a Transpose.")
        return result

    def rewrite(self, op, x: ir.Value, perm: ir.Attr, index: ir.Value, gathered: ir.Value, **_):
        return op.Gather(x, index, axis=perm.as_ints()[self._gathered_position(perm, gathered)])


def layout_rules() -> list:
    """The rules above, ready for a `RewriteRuleSet`."""
    return [SqueezeOfUnsqueeze.rule(), SqueezeOfTranspose.rule(), GatherOfTranspose.rule()]
