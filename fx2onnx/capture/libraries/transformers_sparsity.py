"""Gemma 3n's activation sparsity, its normal quantile computed once in Python.

Gemma 3n's MLP keeps the activations above a cutoff, the mean plus a number of standard
deviations: the normal quantile of the layer's sparsity (`_gaussian_topk`), computed on
each call with `torch.distributions.Normal(0, 1).icdf(...)`. That distribution broadcasts
its arguments and checks them (`broadcast_tensors`, `_is_all_true`), whose decompositions
give an aliasing primitive (`prims::broadcast_in_dim`) the export's decomposition cannot
functionalize. The quantile depends on the config alone: during a capture it is computed
in Python (`statistics.NormalDist`) and the rest of the cutoff as transformers writes it.

Knows transformers only by name (library_adapters.CAPTURE_REWRITES): never imports it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch


def quantile_as_a_constant(original: Callable[..., Any]) -> Callable[..., Any]:
    """``_gaussian_topk(self, inputs)`` with the normal quantile of ``self.activation_sparsity``
    a constant: the inputs above mean + quantile x standard deviation (the excess kept)."""

    def _gaussian_topk(self: Any, inputs: torch.Tensor) -> torch.Tensor:
        multiplier = statistics.NormalDist().inv_cdf(float(self.activation_sparsity))
        # as transformers computes it: in float32, then in the inputs' dtype
        multiplier = torch.tensor(multiplier, dtype=torch.float32).to(inputs.dtype)
        mean = torch.mean(inputs, dim=-1, keepdim=True)
        std = torch.std(inputs, dim=-1, keepdim=True, unbiased=False)
        return torch.nn.functional.relu(inputs - (mean + std * multiplier))

    _gaussian_topk.__wrapped__ = original  # type: ignore[attr-defined]
    return _gaussian_topk
