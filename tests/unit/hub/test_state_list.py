"""RWKV's state list named as the folder's past/present states (state_list.py), and which
models without a cache get a folder that recomputes the sequence (recomputed.py)."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest

from fx2onnx.hub.decoders.recomputed import generation_inputs_refusal
from fx2onnx.hub.decoders.state_list import name_state_list

transformers = pytest.importorskip("transformers")


def _graph(outputs: list[str]) -> ir.Model:
    """Inputs state.0 and state.1; each output an Identity of one of them (logits of state.0)."""
    def info(name):
        return onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1, 4, 2])
    nodes = [onnx.helper.make_node("Identity", [f"state.{name.split('.')[1][0]}" if name != "logits" else "state.0"],
                                   [name]) for name in outputs]
    graph = onnx.helper.make_graph(nodes, "g", [info("state.0"), info("state.1")], [info(name) for name in outputs])
    return ir.from_proto(onnx.helper.make_model(graph))


def test_the_state_list_becomes_past_and_present_states():
    model = _graph(["state.0.mutated", "state.1.mutated", "logits", "state.0_1", "state.1_1"])
    assert name_state_list(model) == ["past_state.0", "past_state.1"]
    assert [v.name for v in model.graph.inputs] == ["past_state.0", "past_state.1"]
    # the written inputs' copies dropped: one next value per state
    assert [v.name for v in model.graph.outputs] == ["logits", "present_state.0", "present_state.1"]


def test_a_state_without_its_next_value_is_an_error():
    with pytest.raises(ValueError, match="takes state.1 but returns no next value of it"):
        name_state_list(_graph(["logits", "state.0_1"]))


def test_only_a_model_fed_the_sequence_alone_is_recomputed():
    gpt = transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig(n_positions=16, n_embd=8, n_layer=1, n_head=2,
                                                                         vocab_size=20))
    assert generation_inputs_refusal(gpt) is None
    xlm = transformers.XLMWithLMHeadModel(transformers.XLMConfig(vocab_size=20, emb_dim=8, n_layers=1, n_heads=2,
                                                                 lang_id=0))
    assert generation_inputs_refusal(xlm) == ("the sequence with 1 token(s) appended and input(s) of its own (langs) "
                                              "and no attention mask (it drops the one it is given)")
    reformer = transformers.ReformerModelWithLMHead(transformers.ReformerConfig(
        vocab_size=20, hidden_size=8, attention_head_size=4, num_attention_heads=2, attn_layers=["local"],
        feed_forward_size=8, axial_pos_embds=False, max_position_embeddings=16, is_decoder=True))
    assert generation_inputs_refusal(reformer) == "no attention mask (it drops the one it is given)"
