"""Dims asked to be dynamic whose example size is 1, when a capture fixed them anyway.

torch.export fixes a dynamic dim of example size 1 wherever code compares it with 1,
and torch's own kernels do so too (in torch 2.14 the fake convolution chooses a memory
format by `batch <= 1`), so an image model exported from a single image loses its
dynamic batch. The model is therefore first captured from a grown example: the same
inputs repeated to size 2 along those dims (the model computes the same for each copy),
the sizes torch.export treats as general. That capture is kept where no line of the
model's code compared those dims (its guards say so: `guards.model_lines_comparing`);
torch's own comparisons compute the same at size 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch

from fx2onnx.capture.dynamic_dims.spec import RequestedDims, RequestedInput


class Example(NamedTuple):
    """Example inputs and the dims asked to be dynamic in them."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    requested: RequestedDims
    grown_dims: frozenset[tuple[str, int]] = frozenset()  # (input path, dim) repeated from 1 to 2


def grown_example(args: Sequence[Any], kwargs: Mapping[str, Any], requested: RequestedDims) -> Example:
    """``args`` and ``kwargs`` with every requested dynamic dim of size 1 repeated to 2
    (the same tensor twice), and ``requested`` keyed by the grown tensors."""
    grown_requested: list[RequestedInput] = []
    grown_dims: set[tuple[str, int]] = set()

    def grow(leaf: Any) -> Any:
        asked = requested.of(leaf)
        if asked is None:
            return leaf
        grown = leaf
        for dim in asked.dims:
            if grown.shape[dim] == 1:
                grown = torch.cat([grown, grown], dim=dim)
                grown_dims.add((asked.path, dim))
        grown_requested.append(RequestedInput(grown, asked.path, asked.dims))
        return grown

    grown_args, grown_kwargs = torch.utils._pytree.tree_map(grow, (tuple(args), dict(kwargs)))
    return Example(grown_args, grown_kwargs, RequestedDims(grown_requested), frozenset(grown_dims))
