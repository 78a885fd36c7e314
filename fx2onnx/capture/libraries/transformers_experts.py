"""transformers' mixtures of experts whose routing loop torch.export cannot capture.

**Experts that loop over the routed experts, captured densely.**

Switch Transformers' experts (`SwitchTransformersExperts`, an `nn.ModuleDict` with one
feed-forward module per expert) loop over the experts that some token was routed to
(`expert_mask.sum(...).nonzero()`) and gather those tokens (`torch.where`): a loop and
sizes that depend on the routing, which torch.export cannot capture. During a capture
every expert runs on every token and its output is weighted by the token's routing weight
for it, which is zero for an expert the router did not pick (or a token dropped by the
expert's capacity): the sum is the original's for every routing. It costs every expert on
every token. LongCat-Flash's experts (`LongcatFlashExperts`: weights stacked per expert,
then identity experts that return their tokens) loop the same way and are run the same way, and
so are DBRX's (`DbrxExperts`: a gated MLP whose weights hold every expert's rows one after another).

**Experts whose model asks for transformers' "eager" experts implementation** (the OpenAI
Privacy Filter does by default): transformers' experts classes (`@use_experts_implementation`)
then loop over the experts the routing picked, the same loop. During a capture such a model
runs transformers' grouped implementation instead (every expert's tokens in one grouped
matrix product; its batched one where the grouped one cannot run), which torch.export
captures; the model's own choice is restored afterwards. The sums are the same, added in
another order.

Knows transformers only by name (library_adapters.CAPTURE_REWRITES, the model's own
methods): never imports it.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from fx2onnx.user_warnings import ExportWarning, user_stacklevel

# transformers' experts implementations torch.export captures, in the order tried
_CAPTURED_IMPLEMENTATIONS = ("grouped_mm", "batched_mm")


def _settable_experts_implementation(model: Any) -> str | None:
    """The experts implementation of a transformers model whose class can change it (its
    experts `@use_experts_implementation`); None for any other model."""
    can_set = getattr(type(model), "_can_set_experts_implementation", None)
    if can_set is None or not can_set():
        return None
    return getattr(getattr(model, "config", None), "_experts_implementation", None)


@contextlib.contextmanager
def experts_without_routing_loops(model: Any) -> Iterator[None]:
    """While inside, ``model`` (a transformers model that asks for the "eager" experts
    implementation) runs a captured one instead; anything else is left as it is."""
    if _settable_experts_implementation(model) != "eager":
        yield
        return
    kept = model.get_experts_implementation()
    refusals = []
    for implementation in _CAPTURED_IMPLEMENTATIONS:
        try:
            model.set_experts_implementation(implementation)
            break
        except (ValueError, ImportError, RuntimeError) as error:  # not available here: the next one is tried
            refusals.append(f"{implementation!r}: {error}")
    else:  # the capture goes on with the loop, and says why if it fails on it
        warnings.warn(
            f"{type(model).__name__} asks for transformers' 'eager' experts loop, which torch.export cannot capture, "
            f"and none of the implementations it can capture could be set ({'; '.join(refusals)}). Set "
            "model.set_experts_implementation('grouped_mm') yourself if your transformers version offers it.",
            ExportWarning, stacklevel=user_stacklevel(),
        )
    try:
        yield
    finally:
        model.set_experts_implementation(kept)


@contextlib.contextmanager
def experts_fake_tensors_run(model: Any) -> Iterator[None]:
    """While inside, ``model`` (a transformers model whose experts take the "grouped_mm"
    implementation) runs transformers' "batched_mm" one instead; anything else is left as it is.

    For the eager forwards of a fake model (the prefill its example inputs are made from):
    torch's fake kernel of ``_grouped_mm`` takes bfloat16 alone, as CUDA's kernel does, where
    its CPU kernel takes every float, so a float32 or float16 fake model fails there. A capture
    is not run inside: transformers then takes its own fallback of the grouped product, which
    fake tensors run."""
    if _settable_experts_implementation(model) != "grouped_mm":
        yield
        return
    kept = model.get_experts_implementation()
    model.set_experts_implementation("batched_mm")
    try:
        yield
    finally:
        model.set_experts_implementation(kept)


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


def every_expert_and_identity_weighted(original: Any) -> Any:
    """A forward for LongCat-Flash's experts (``gate_up_proj`` and ``down_proj`` stacked per
    expert, then ``zero_expert_num`` identity experts) given each token's top-k expert
    indices and weights: every expert on every token at once, weighted by the token's weight
    for it (zero where not picked); the identity experts return the token times theirs.
    transformers loops over the experts some token picked (`nonzero()`), as above."""

    def forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        # (tokens, experts): a token's weight for each expert, zero where not picked
        weights = torch.zeros(hidden_states.shape[0], self.total_experts, dtype=top_k_weights.dtype,
                              device=top_k_weights.device).scatter_add(1, top_k_index, top_k_weights)
        routed = self.num_routed_experts if self.gate_up_proj is not None else 0
        # the identity experts: the token times its weights for them
        result = hidden_states * weights[:, routed:].sum(dim=1, keepdim=True).to(hidden_states.dtype)
        if routed:
            gate, up = torch.einsum("td,eid->eti", hidden_states, self.gate_up_proj[:routed]).chunk(2, dim=-1)
            outputs = torch.einsum("eti,edi->etd", self.act_fn(gate) * up, self.down_proj)
            result = result + torch.einsum("etd,te->td", outputs, weights[:, :routed].to(outputs.dtype)).to(hidden_states.dtype)
        return result

    forward.__wrapped__ = original  # type: ignore[attr-defined]
    return forward


def every_stacked_glu_expert_weighted(original: Any) -> Any:
    """A forward for DBRX's experts (``mlp.w1``, ``mlp.v1`` and ``mlp.w2``: each expert's
    ``ffn_hidden_size`` rows one after another) given each token's top-k expert indices and
    weights: every expert's gated MLP on every token at once, weighted by the token's weight
    for it (zero where not picked). transformers loops over the experts some token picked
    (`nonzero()`), as above."""

    def forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        batch = hidden_states.shape[0]
        tokens = hidden_states.reshape(-1, self.hidden_size)
        # (tokens, experts): a token's weight for each expert, zero where not picked
        weights = torch.zeros(tokens.shape[0], self.num_experts, dtype=top_k_weights.dtype,
                              device=top_k_weights.device).scatter_add(1, top_k_index, top_k_weights)
        shape = (self.num_experts, self.ffn_hidden_size, self.hidden_size)
        mlp = self.mlp
        gate = torch.einsum("td,eid->eti", tokens, mlp.w1.view(shape))
        up = torch.einsum("td,eid->eti", tokens, mlp.v1.view(shape))
        outputs = torch.einsum("eti,eid->etd", mlp.activation_fn(gate) * up, mlp.w2.view(shape))
        result = torch.einsum("etd,te->td", outputs, weights.to(outputs.dtype)).to(tokens.dtype)
        return result.view(batch, -1, self.hidden_size)

    forward.__wrapped__ = original  # type: ignore[attr-defined]
    return forward
