"""transformers' ``torch_int`` kept symbolic during a capture, in every transformers module
that imports it.

Vision models size their position embeddings and patch grids with ``torch_int(height)``,
``torch_int(sequence_length ** 0.5)`` (DPT's grid of a square image), transformers' own
cast, which is ``int()`` outside a TorchScript trace. ``int()`` of a symbolic size fixes it
to the example's: the ONNX model then names the image's height and width dynamic but
computes with the example's grid at every size. During a capture, ``torch_int`` passes a
symbolic int through and truncates a symbolic float symbolically (``torch.sym_int``, the
truncation Python's ``int`` applies): the ONNX model computes the size from its input
(a square root as ``Pow(x, 0.5)`` in double precision and a cast to int64, exact for a
perfect square, as eager PyTorch computes it). Every other argument goes to the original.

Depth Anything sizes its depth map with Python's own ``int(patch_height * patch_size)``:
its module gets an ``int`` of the same kind during a capture (a module global shadowing the
builtin, removed afterwards; the module reads ``int`` nowhere else).

Knows transformers only by name (library_adapters.CAPTURE_REWRITES): never imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# transformers' model types whose modeling module sizes an output with the builtin `int` of an image size
INT_SIZED_FAMILIES = ("depth_anything",)


def symbolic_size_as_is(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``torch_int(value)``: a symbolic int (``torch.SymInt``) as it is, and a symbolic float
    (``torch.SymFloat``) truncated symbolically, rather than the ``int`` that fixes either to
    the example's; anything else by ``original``."""

    def torch_int(value: Any) -> Any:
        if isinstance(value, torch.SymInt):
            return value
        if isinstance(value, torch.SymFloat):
            return torch.sym_int(value)
        return original(value)

    torch_int.__wrapped__ = original  # type: ignore[attr-defined]
    return torch_int
