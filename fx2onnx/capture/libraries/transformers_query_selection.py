"""RT-DETR-style detectors (RT-DETR, RT-DETR v2, D-FINE, DEIMv2, PP-DocLayout): the batch
kept symbolic where their code reads it as a Python int.

Before selecting its queries, the model counts the images with ``len(source_flatten)``.
Python's ``len`` must return an ``int``: a tensor's symbolic first dim is made one by
fixing it to the example's, so the whole export takes only the example's batch. (Their
encoder's ``torch_int(height)`` is every transformers module's:
:mod:`fx2onnx.capture.libraries.transformers_symbolic_sizes`.)

During a capture, the modules of these models see a ``len`` of their own that gives a
tensor's first dim as it is (an ``int`` in eager PyTorch, as ``len`` gives; a symbol in a
capture); every other argument goes to the original. Nothing else of the code changes.

Knows transformers only by name (library_adapters.CAPTURE_REWRITES): never imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# transformers' model types whose modeling module counts the images with `len(source_flatten)`
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
