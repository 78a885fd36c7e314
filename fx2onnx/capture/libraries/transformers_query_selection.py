"""RT-DETR-style detectors (RT-DETR, RT-DETR v2, D-FINE, DEIMv2, PP-DocLayout): the batch
and the image's sizes kept symbolic where their code reads them as Python ints.

Before selecting its queries, the model counts the images with ``len(source_flatten)``.
Python's ``len`` must return an ``int``: a tensor's symbolic first dim is made one by
fixing it to the example's, so the whole export takes only the example's batch. And its
encoder sizes the position embedding of its last feature map with
``torch_int(height)``/``torch_int(width)``, transformers' own cast, which is ``int()``
outside a TorchScript trace: the image's height and width fixed the same way (both are
sizes any image processor setting can change).

During a capture, the modules of these models see a ``len`` of their own that gives a
tensor's first dim as it is (an ``int`` in eager PyTorch, as ``len`` gives; a symbol in a
capture), and a ``torch_int`` that passes a symbolic size through; every other argument
goes to the original. Nothing else of the code changes: the same ops on the same sizes.

Knows transformers only by name (library_adapters.CAPTURE_REWRITES): never imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# transformers' model types whose modeling module counts the images with `len(source_flatten)`
# and sizes its position embedding with `torch_int`
QUERY_SELECTION_FAMILIES = ("rt_detr", "rt_detr_v2", "d_fine", "deimv2", "pp_doclayout_v2", "pp_doclayout_v3")


def first_dim_as_is(original: Callable[[Any], int]) -> Callable[[Any], Any]:
    """``len(value)``: a tensor's first dim as its shape holds it (a symbol during a capture),
    anything else (and a 0-d tensor, which has no length) by ``original``."""

    def tensor_len(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value.shape[0]
        return original(value)

    tensor_len.__wrapped__ = original  # type: ignore[attr-defined]
    return tensor_len


def symbolic_size_as_is(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``torch_int(value)``: a symbolic size (``torch.SymInt``) as it is, rather than the
    ``int`` that fixes it to the example's; anything else by ``original``."""

    def torch_int(value: Any) -> Any:
        if isinstance(value, torch.SymInt):
            return value
        return original(value)

    torch_int.__wrapped__ = original  # type: ignore[attr-defined]
    return torch_int
