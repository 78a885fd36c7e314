"""The model a quantized folder is meant to compute: the float model with the folder's weights
rounded to their grids, against which its verification judges the folder, and how far that
rounding alone moves the float logits (the quantization's own error, the judgment's bound).

A folder's ONNX files keep each quantized weight as ``<weight>_Q<bits>`` beside
``<weight>_scales`` (and ``<weight>_zero_points`` when asymmetric; weight_quantization.py,
embedding_quantization.py), ``<weight>`` the model's parameter. `rounded_model` runs the
float model with each such weight rounded by `nbits_packing.rounded_weight` with the bits,
block size and symmetry the folder stores, computed from the float weight, never read back
from the folder's codes (a wrong code or scale in the folder is not in the reference), by
the folder's algorithm (the LM head's own where it has one).

How much rounding moves the logits is the model's own affair: tiny random models, whose
logits are small and whose routers and top-k selections flip on small changes, move by a
third of their largest logit; trained ones by a few percent.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
from torch.nn.utils import parametrize

from fx2onnx.onnx_passes import rounded_weight

_CODES = re.compile(r"(.+)_Q(4|8)")


@dataclass(frozen=True)
class StoredWeight:
    """A weight as a folder stores it: ``rows`` (N) of ``blocks`` blocks each."""

    name: str
    bits: int
    rows: int
    blocks: int
    symmetric: bool


def stored_weights(paths: Iterable[Path]) -> list[StoredWeight]:
    """The quantized weights of the ONNX files at ``paths`` (their graphs read without weights)."""
    found: dict[str, StoredWeight] = {}
    for path in paths:
        dims = {t.name: list(t.dims) for t in onnx.load(str(path), load_external_data=False).graph.initializer}
        for name, shape in dims.items():
            match = _CODES.fullmatch(name)
            scales = dims.get(f"{match.group(1)}_scales") if match else None
            if match is None or scales is None:
                continue
            rows = shape[0]
            found[match.group(1)] = StoredWeight(match.group(1), int(match.group(2)), rows, math.prod(scales) // rows,
                                                 f"{match.group(1)}_zero_points" not in dims)
    return list(found.values())


def float_weights(paths: Iterable[Path]) -> set[str]:
    """The names of the float initializers of the ONNX files at ``paths``: a weight the folder
    also keeps float (an embedding table its quantized head is tied to, unless the embedding
    gathers from the head's codes)."""
    names: set[str] = set()
    for path in paths:
        for tensor in onnx.load(str(path), load_external_data=False).graph.initializer:
            if tensor.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):
                names.add(tensor.name)
    return names


class _Rounded(torch.nn.Module):
    """A parametrization giving a weight rounded as the folder rounds it."""

    def __init__(self, stored: StoredWeight, block_size: int, transposed: bool, algorithm: str) -> None:
        super().__init__()
        self.stored, self.block_size, self.transposed, self.algorithm = stored, block_size, transposed, algorithm

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        rows = weight.t() if self.transposed else weight
        rounded = rounded_weight(rows, self.stored.bits, self.block_size, self.stored.symmetric, self.algorithm)
        return rounded.t() if self.transposed else rounded


def _block_size(columns: int, blocks: int) -> int | None:
    """The power-of-two block size (at least 16) cutting ``columns`` into ``blocks`` blocks."""
    size = 16
    while size < 2 * max(columns, 1) and -(-columns // size) > blocks:
        size *= 2
    return size if -(-columns // size) == blocks else None


def _rounding(module: torch.nn.Module, weight: torch.Tensor, stored: StoredWeight, algorithm: str) -> _Rounded | None:
    """How to round ``weight`` (a parameter of ``module``) as ``stored`` says, or None when its
    shape is not the stored one's. transformers' Conv1D keeps its weight as [in, out]."""
    transposed = type(module).__name__ == "Conv1D"
    if weight.dim() != 2 or (weight.shape[1] if transposed else weight.shape[0]) != stored.rows:
        return None
    block_size = _block_size(weight.shape[0] if transposed else weight.shape[1], stored.blocks)
    return None if block_size is None else _Rounded(stored, block_size, transposed, algorithm)


@contextlib.contextmanager
def rounded_model(
    model: torch.nn.Module, weights: Iterable[StoredWeight], algorithm: str = "rtn", head_algorithm: str | None = None,
    kept_float: Collection[str] | None = None,
) -> Iterator[list[str]]:
    """``model`` with each of ``weights`` rounded as the folder stores it (by ``algorithm``;
    the LM head by ``head_algorithm``, default the same), until the block ends (then its float
    weights are back, untouched); gives the names it could not round (no such parameter, or
    another shape). With ``kept_float`` (the folder's float weights), the other modules a
    rounded parameter is tied to (an embedding to its head) read it rounded too, unless the
    folder keeps it float under one of its names."""
    parameters = dict(model.named_parameters(remove_duplicate=False))  # a tied head under its own name too
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weights = list(weights)
    stored_names = {stored.name for stored in weights}
    rounded, missing = [], []
    try:
        for stored in weights:
            module = model.get_submodule(stored.name.rpartition(".")[0]) if stored.name in parameters else None
            chosen = (head_algorithm or algorithm) if module is not None and module is head else algorithm
            rounding = None if module is None else _rounding(module, parameters[stored.name], stored, chosen)
            if rounding is None:
                missing.append(stored.name)
                continue
            names = [name for name, parameter in parameters.items() if parameter is parameters[stored.name]]
            # the folder keeps the float table under any of its names: the tied modules read that
            tied = [] if kept_float is None or set(names) & set(kept_float) else [n for n in names if n not in stored_names]
            for name in [stored.name, *tied]:
                owner, _, attribute = name.rpartition(".")
                parametrize.register_parametrization(model.get_submodule(owner), attribute, rounding)
                rounded.append((model.get_submodule(owner), attribute))
        yield missing
    finally:
        for module, attribute in reversed(rounded):
            parametrize.remove_parametrizations(module, attribute, leave_parametrized=False)
