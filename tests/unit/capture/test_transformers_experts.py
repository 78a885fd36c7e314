"""Switch Transformers' experts, run densely during a capture
(`fx2onnx/capture/libraries/transformers_experts.py`): the same outputs as transformers'
loop over the routed experts, whether or not the experts' capacity drops tokens, and an
export whose token count stays dynamic."""

from __future__ import annotations

import pytest
import torch

import fx2onnx
from fx2onnx.capture.library_adapters import rewritten_library_functions

transformers = pytest.importorskip("transformers")


def _sparse_mlp(capacity: int) -> torch.nn.Module:
    from transformers.models.switch_transformers import modeling_switch_transformers as switch

    torch.manual_seed(0)
    config = transformers.SwitchTransformersConfig(d_model=16, d_ff=32, num_experts=4, expert_capacity=capacity,
                                                   router_jitter_noise=0.0)
    return switch.SwitchTransformersSparseMLP(config).eval()


@pytest.mark.parametrize("capacity", [2, 64], ids=["tokens_dropped", "every_token_kept"])
def test_every_expert_weighted_equals_the_loop_over_routed_experts(capacity: int) -> None:
    mlp = _sparse_mlp(capacity)
    hidden = torch.randn(3, 11, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = mlp(hidden)
        original = type(mlp.experts).forward
        with rewritten_library_functions():
            assert type(mlp.experts).forward is not original
            got = mlp(hidden)
        assert type(mlp.experts).forward is original
    dropped = (want == 0).all(-1).sum()
    assert (dropped > 0) == (capacity == 2)  # the small capacity reaches the tokens it drops
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)  # float sums in another order


def test_switch_experts_export_with_a_dynamic_token_count(export_and_compare) -> None:
    mlp = _sparse_mlp(capacity=3)
    first, second = torch.randn(2, 9, 16), torch.randn(3, 5, 16)
    program = export_and_compare(mlp, (first,), options=fx2onnx.ExportOptions(dynamic_shapes=True),
                                 second_inputs=((second,), {}))
    assert isinstance(program.model.graph.outputs[0].shape[1].value, str)
    assert not [n for n in program.model.graph.all_nodes() if n.op_type in ("NonZero", "Loop")]


def test_a_model_asking_for_the_eager_experts_loop_is_captured_with_the_grouped_one(export_and_compare) -> None:
    """The OpenAI Privacy Filter asks for transformers' "eager" experts implementation (a loop
    over the routed experts) by default: exported with the grouped one, equal to PyTorch's
    eager loop at two token counts (its router given random weights: a zero router ties every
    expert), with the model's own choice restored after the export."""
    config = transformers.OpenAIPrivacyFilterConfig(
        hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_local_experts=4, num_experts_per_tok=2, vocab_size=64, num_labels=3, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    torch.manual_seed(0)
    model = transformers.OpenAIPrivacyFilterForTokenClassification(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "router" in name:
                parameter.copy_(torch.randn(parameter.shape))
    assert model.config._experts_implementation == "eager"
    first = torch.randint(0, 64, (2, 9))
    second = torch.randint(0, 64, (3, 5))
    program = export_and_compare(model, (first,), options=fx2onnx.ExportOptions(dynamic_shapes=True),
                                 second_inputs=((second,), {}))
    assert model.config._experts_implementation == "eager"
    assert not [n for n in program.model.graph.all_nodes() if n.op_type in ("NonZero", "Loop")]


class _OnlyEagerExperts:
    """A model that asks for the "eager" experts loop where no captured implementation can be set."""

    def __init__(self) -> None:
        self.config = type("Config", (), {"_experts_implementation": "eager"})()
        self.implementation = "eager"

    @classmethod
    def _can_set_experts_implementation(cls) -> bool:
        return True

    def get_experts_implementation(self) -> str:
        return self.implementation

    def set_experts_implementation(self, implementation: str) -> None:
        if implementation != "eager":
            raise ValueError(f"{implementation} needs a newer torch")
        self.implementation = implementation


def test_experts_loop_kept_with_a_warning_when_no_captured_implementation_can_be_set() -> None:
    from fx2onnx.capture.libraries.transformers_experts import experts_without_routing_loops

    model = _OnlyEagerExperts()
    with pytest.warns(fx2onnx.ExportWarning, match="grouped_mm.*needs a newer torch.*batched_mm") as caught:
        with experts_without_routing_loops(model):
            assert model.implementation == "eager"
    assert len(caught) == 1 and model.implementation == "eager"


def _with_random_weights(module: torch.nn.Module) -> torch.nn.Module:
    for parameter in module.parameters():  # the experts' weights start uninitialized (torch.empty)
        torch.nn.init.normal_(parameter, std=0.5)
    return module.eval()


def _longcat_moe() -> torch.nn.Module:
    from transformers.models.longcat_flash import modeling_longcat_flash as longcat

    torch.manual_seed(0)
    config = transformers.LongcatFlashConfig(hidden_size=16, expert_ffn_hidden_size=8, n_routed_experts=4,
                                             zero_expert_num=2, moe_topk=2)
    return _with_random_weights(longcat.LongcatFlashMoE(config))


def test_longcat_experts_and_identity_experts_weighted_equal_the_loop() -> None:
    # LongCat-Flash's experts: four with weights and two identity ("zero") experts, top 2 of 6
    moe = _longcat_moe()
    hidden = torch.randn(3, 11, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, _, chosen = moe.router(hidden)
        want = moe(hidden)
        with rewritten_library_functions():
            got = moe(hidden)
    assert (chosen >= 4).any() and (chosen < 4).any()  # both kinds of expert are picked
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)  # float sums in another order


def test_longcat_experts_export_with_a_dynamic_token_count(export_and_compare) -> None:
    moe = _longcat_moe()
    program = export_and_compare(moe, (torch.randn(2, 9, 16),), options=fx2onnx.ExportOptions(dynamic_shapes=True),
                                 second_inputs=((torch.randn(3, 5, 16),), {}))
    assert not [n for n in program.model.graph.all_nodes() if n.op_type in ("NonZero", "Loop")]


def _dbrx_ffn() -> torch.nn.Module:
    from transformers.models.dbrx import modeling_dbrx as dbrx

    torch.manual_seed(0)
    config = transformers.DbrxConfig(d_model=16, n_heads=2, ffn_config={"ffn_hidden_size": 8, "moe_num_experts": 4,
                                                                        "moe_top_k": 2})
    return _with_random_weights(dbrx.DbrxFFN(config))


def test_dbrx_experts_weighted_equal_the_loop() -> None:
    # DBRX's experts: four gated MLPs stacked in one weight each, top 2 of 4; some expert left unpicked
    ffn = _dbrx_ffn()
    hidden = torch.randn(3, 11, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ffn(hidden)
        with rewritten_library_functions():
            got = ffn(hidden)
        few = hidden[:1, :1]  # one token: two experts of four picked
        want_few = ffn(few)
        with rewritten_library_functions():
            got_few = ffn(few)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)  # float sums in another order
    torch.testing.assert_close(got_few, want_few, rtol=0, atol=1e-5)


def test_dbrx_experts_export_with_a_dynamic_token_count(export_and_compare) -> None:
    ffn = _dbrx_ffn()
    program = export_and_compare(ffn, (torch.randn(2, 9, 16),), options=fx2onnx.ExportOptions(dynamic_shapes=True),
                                 second_inputs=((torch.randn(3, 5, 16),), {}))
    assert not [n for n in program.model.graph.all_nodes() if n.op_type in ("NonZero", "Loop")]
