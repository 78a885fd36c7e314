"""transformers' mixtures of experts kept as one module per expert, captured densely.

Switch Transformers' experts (`SwitchTransformersExperts`, an `nn.ModuleDict` with one
feed-forward module per expert) loop over the experts that some token was routed to
(`expert_mask.sum(...).nonzero()`) and gather those tokens (`torch.where`): a loop and
sizes that depend on the routing, which torch.export cannot capture. During a capture
every expert runs on every token and its output is weighted by the token's routing weight
for it, which is zero for an expert the router did not pick (or a token dropped by the
expert's capacity): the sum is the original's for every routing. It costs every expert on
every token.

Knows transformers only by name (library_adapters.CAPTURE_REWRITES): never imports it.
"""

from __future__ import annotations

from typing import Any

import torch


def every_expert_weighted(original: Any) -> Any:
    """A forward for a ModuleDict of experts (``expert_{i}``) given the one-hot choices
    ``selected_experts`` (tokens, top-k, experts) and their ``routing_weights`` (tokens,
    top-k): each expert on every token, weighted by the token's weight for it."""

    def forward(self: Any, hidden_states: torch.Tensor, selected_experts: torch.Tensor,
                routing_weights: torch.Tensor) -> torch.Tensor:
        # (tokens, experts): a token's weight for each expert, zero where not picked
        weights = (selected_experts.to(routing_weights.dtype) * routing_weights[..., None]).sum(dim=1)
        result = torch.zeros_like(hidden_states)
        for index in range(self.num_experts):
            output = self[f"expert_{index}"](hidden_states) * weights[:, index, None]
            result = result + output.to(hidden_states.dtype)
        return result

    forward.__wrapped__ = original  # type: ignore[attr-defined]
    return forward
