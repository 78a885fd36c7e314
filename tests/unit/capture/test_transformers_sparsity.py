"""Gemma 3n's activation sparsity: its normal quantile a constant during a capture, the MLP
equal to transformers' and exported."""

from __future__ import annotations

import pytest
import torch

import fx2onnx
from fx2onnx.capture.library_adapters import rewritten_library_functions

transformers = pytest.importorskip("transformers")


def _sparse_mlp(sparsity: float) -> torch.nn.Module:
    from transformers.models.gemma3n import modeling_gemma3n as gemma3n

    config = transformers.Gemma3nTextConfig(hidden_size=16, intermediate_size=[32], num_hidden_layers=1,
                                            activation_sparsity_pattern=[sparsity], layer_types=["full_attention"])
    torch.manual_seed(0)
    return gemma3n.Gemma3nTextMLP(config, layer_idx=0).eval()


@pytest.mark.parametrize("sparsity", [0.95, 0.6])
def test_the_constant_quantile_keeps_transformers_cutoff(sparsity: float) -> None:
    mlp = _sparse_mlp(sparsity)
    hidden = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = mlp(hidden)
        with rewritten_library_functions():
            got = mlp(hidden)
    assert (mlp.gate_proj(hidden) > 0).sum() > 0 and want.abs().sum() > 0
    # the quantile rounded from double against torch's float32 one: a unit in its last place at most
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_a_sparse_mlp_exports_with_a_dynamic_token_count(export_and_compare) -> None:
    # without the rewrite the decomposition fails on torch.distributions' checks (prims::broadcast_in_dim)
    program = export_and_compare(_sparse_mlp(0.95), (torch.randn(2, 7, 16),),
                                 options=fx2onnx.ExportOptions(dynamic_shapes=True),
                                 second_inputs=((torch.randn(1, 3, 16),), {}))
    assert not [n for n in program.model.graph.all_nodes() if n.op_type == "Erf"]  # no quantile computed in the graph
