"""DeepSeek-V4's text-generation folder: export-hf's own decode step, its compressors' counts
taken from the past length (fx2onnx/hub/decoders/compressed_attention.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.decoders import compressed_attention

transformers = pytest.importorskip("transformers")


def deepseek_v4() -> torch.nn.Module:
    """A sliding layer, a compressed sparse one (windows of 4, an indexer keeping 3 entries) and a
    heavily compressed one (windows of 8); position biases, sinks and the hash router's table
    random (transformers starts them at zeros); 16 indexer heads, as 2 give several entries the
    same score (a ReLU's zeros), where torch's and onnxruntime's top-k pick different ones."""
    config = transformers.DeepseekV4Config(
        vocab_size=100, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        q_lora_rank=16, o_lora_rank=16, o_groups=2, index_n_heads=16, index_head_dim=8, index_topk=3,
        moe_intermediate_size=16, n_routed_experts=2, num_experts_per_tok=1, sliding_window=6,
        max_position_embeddings=256, qk_rope_head_dim=2, partial_rotary_factor=0.25,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
        mlp_layer_types=["hash_moe", "moe", "moe"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8})
    torch.manual_seed(0)
    model = transformers.DeepseekV4ForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "position_bias" in name or "sinks" in name:
                parameter.normal_(0, 0.5)
        model.model.layers[0].mlp.gate.tid2eid.random_(0, config.n_routed_experts)
    return model


def test_the_step_over_zero_length_states_is_transformers_forward_at_every_length() -> None:
    # every count from the past length, in eager PyTorch: a prefill of 7 then single tokens past the windows
    # of 4 and 8 and the sliding window of 6, against transformers' forward over its own cache
    model = deepseek_v4()
    step = compressed_attention.CompressedAttentionStep(model)
    ids = torch.randint(3, 100, (2, 20), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # a left-padded row
    states = compressed_attention.empty_states(model, 2)
    cache, done = transformers.DynamicCache(config=model.config), 0
    with torch.no_grad():
        for length in [7] + [1] * 13:
            given = mask[:, :done + length]
            positions = (given.cumsum(-1) - 1).masked_fill(given == 0, 0)[:, done:]
            theirs = model(input_ids=ids[:, done:done + length], attention_mask=given, position_ids=positions, cache=cache)
            logits, *states = step(ids[:, done:done + length], given, states)
            cache, done = theirs.cache, done + length
            torch.testing.assert_close(logits, theirs.logits, rtol=1e-5, atol=1e-6)
    names = [state.name for state in compressed_attention.state_layout(model.config)]
    assert names == ["past_key_values.0.key", "past_key_values.1.key", "past_key_values.1.value",
                     "past_compressor.1.kv", "past_compressor.1.gate", "past_indexer.1.kv", "past_indexer.1.gate",
                     "past_key_values.2.key", "past_key_values.2.value", "past_compressor.2.kv", "past_compressor.2.gate"]
    # the rows kept: 20 tokens are 5 windows of 4 (the last window and none waiting) and 2 of 8 with 4 waiting
    assert [tuple(s.shape) for s in states[1:7]] == [(2, 1, 5, 8), (2, 1, 5, 16), (2, 4, 16), (2, 4, 16), (2, 4, 16),
                                                     (2, 4, 16)]
    assert [tuple(s.shape) for s in states[7:]] == [(2, 1, 5, 8), (2, 1, 2, 8), (2, 4, 8), (2, 4, 8)]


def test_the_folder_is_verified_and_takes_the_states_transformers_js_feeds(tmp_path: Path) -> None:
    deepseek_v4().save_pretrained(tmp_path / "source")
    said: list[str] = []
    result = export_hf(tmp_path / "source", tmp_path / "out", task="text-generation", verify=True, say=said.append)
    verification = result.verification
    assert verification.passed and verification.tokens_equal and verification.max_logit_difference < 1e-4
    assert "a prompt of 16 tokens (past compression window 4, sliding window 6, compression window 8)" in verification.lengths
    assert any("counts its windows in Python numbers" in line for line in said)
    path = os.fspath(tmp_path / "out" / "onnx" / "model.onnx")
    onnx.checker.check_model(onnx.load(path), full_check=True)
    graph = onnx.load(path, load_external_data=False).graph
    shapes = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}
    assert shapes["attention_mask"] == ["batch_size", "total_sequence_length"] and "position_ids" not in shapes
    assert shapes["past_compressor.1.kv"] == ["batch_size", "past_compressor_1_kv_length", 16]
    assert [o.name for o in graph.output][:3] == ["logits", "present.0.key", "present.1.key"]
    assert not (tmp_path / "out" / "genai_config.json").exists()


def test_float16_and_bfloat16_folders_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    from fx2onnx.hub.tasks import UnsupportedTaskError

    # float16: transformers keeps the compressors' projections in float32, which take float16 hidden states on CPU;
    # bfloat16: the routed experts' grouped product has no translation
    deepseek_v4().save_pretrained(tmp_path / "source")
    with pytest.raises(UnsupportedTaskError, match=r"does not run in float16: transformers keeps 7 of its weights in float32 "
                                                   r"\(its class's _keep_in_fp32_modules: model\.layers\.1\.self_attn\.compressor"
                                                   r"\.kv_proj\.weight.*RuntimeError: expected m1 and m2 to have the same dtype.*"
                                                   r"No folder was written\. Export it in float32"):
        export_hf(tmp_path / "source", tmp_path / "out", task="text-generation", precision="fp16")
    assert not (tmp_path / "out").exists()
    with pytest.raises(UnsupportedTaskError, match=r"in bfloat16: its routed experts run torch's bfloat16 grouped product "
                                                   r"\(_grouped_mm with offsets\), which has no ONNX translation.*No folder "
                                                   r"was written\. Export it in float32"):
        export_hf(tmp_path / "source", tmp_path / "out", task="text-generation", precision="bf16")
    assert not (tmp_path / "out").exists()


def _checkpoint_under_the_models_names(model: torch.nn.Module, folder: Path) -> None:
    """``model`` saved with its tensors under its own names (its experts stacked), which
    transformers loads as they are and fake mode streams."""
    import safetensors.torch

    model.save_pretrained(folder)
    safetensors.torch.save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()},
                                os.fspath(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("mode", ["fake", "int4 with module functions"])
def test_the_folder_of_another_mode_matches_transformers_past_every_window(tmp_path: Path, mode: str) -> None:
    # 8 new tokens after a prompt of 16 close windows of 4 and 8 in decode steps too (at 20 and 24)
    from fx2onnx.hub.decoders.model_lengths import verification_lengths
    from fx2onnx.hub.decoders.verify_lengths import verify_causal_lm_at_lengths
    from fx2onnx.hub.shared.quantization_error import float_weights, rounded_model, stored_weights
    from fx2onnx.hub.shared.verification import Tolerance

    model = deepseek_v4()
    _checkpoint_under_the_models_names(model, tmp_path / "source")
    lengths = verification_lengths(model.config, 8)
    assert lengths.describe() == ("a prompt of 16 tokens (past compression window 4, sliding window 6, compression window "
                                  "8), 8 decode steps to length 24, a left-padded batch of 16, 11, 4 tokens")
    if mode == "fake":  # --verify runs the folder at those lengths
        result = export_hf(tmp_path / "source", tmp_path / "out", task="text-generation", fake=True, verify=True, tokens=8)
        verification = result.verification
        assert verification.lengths == lengths.describe()
        path = tmp_path / "out" / "onnx" / "model.onnx"
    else:
        # --verify of a quantized folder: one pass against transformers, its decode steps against that pass; the
        # padded batch is run here too, against transformers with the weights rounded as the folder stores them
        # (float activations: accuracy level 0)
        said: list[str] = []
        result = export_hf(tmp_path / "source", tmp_path / "out", task="text-generation", precision="int4",
                           module_functions=True, accuracy_level=0, verify=True, tokens=8, say=said.append)
        assert result.verification.passed
        steps = [line for line in said if line.startswith("verification of the decode steps: largest difference")]
        assert steps and "within the tolerance" in steps[0]
        path = tmp_path / "out" / "onnx" / "model_q4.onnx"
        _a_dropped_state_is_caught(path, model, lengths)
        graph = onnx.load(os.fspath(path), load_external_data=False)
        quantized = [node for function in graph.functions for node in function.node if node.op_type == "MatMulNBits"]
        assert graph.functions and quantized and {a.i for n in quantized for a in n.attribute if a.name == "bits"} == {4}
        with rounded_model(model, stored_weights([path]), kept_float=float_weights([path])) as missing:
            assert not missing
            verification = verify_causal_lm_at_lengths(path, model, model.config, lengths, Tolerance(1e-3, 1e-4))
    assert verification.passed and verification.tokens_equal, verification.summary()
    assert verification.max_logit_difference < 1e-4
    onnx.checker.check_model(onnx.load(os.fspath(path)), full_check=True)


def _a_dropped_state_is_caught(path: Path, model: torch.nn.Module, lengths: Any) -> None:
    """The decode steps' check fails on a copy of the folder's model whose sparse layer forgets
    its compressor's waiting rows at every step, zeroed (the one pass, from empty states, is unchanged)."""
    from fx2onnx.hub.decoders.verify_lengths import verify_steps_against_one_pass
    from fx2onnx.hub.shared.verification import QUANTIZED_ACTIVATION_ERROR

    edited = onnx.load(os.fspath(path))
    graph = edited.graph
    for node in graph.node:  # the output's producer writes a raw value, zeroed after it
        node.output[:] = ["forgotten_raw" if name == "present_compressor.1.kv" else name for name in node.output]
    graph.initializer.append(onnx.numpy_helper.from_array(np.zeros((), dtype=np.float32), "forgotten_zero"))
    graph.node.append(onnx.helper.make_node("Mul", ["forgotten_raw", "forgotten_zero"], ["present_compressor.1.kv"]))
    broken = path.with_name("broken.onnx")
    onnx.save(edited, os.fspath(broken), save_as_external_data=True, location="broken.onnx_data")
    kept = verify_steps_against_one_pass(path, model, model.config, lengths, QUANTIZED_ACTIVATION_ERROR)
    verdict = verify_steps_against_one_pass(broken, model, model.config, lengths, QUANTIZED_ACTIVATION_ERROR)
    assert kept.passed and kept.max_logit_difference < 1e-5
    assert verdict.failure is None and not verdict.passed and verdict.max_logit_difference < float("inf")


def test_fake_mode_refuses_a_checkpoint_whose_experts_transformers_stacks_at_load(tmp_path: Path) -> None:
    # save_pretrained writes DeepSeek-V4's experts one by one, under the original names: refused before any capture
    deepseek_v4().save_pretrained(tmp_path / "source")
    with pytest.raises(NotImplementedError, match=r"stores 18 tensors that transformers converts when it loads them.*"
                                                  r"'model\.layers\.0\.ffn\.experts\.0\.w1\.weight' goes into the model's "
                                                  r"'model\.layers\.0\.mlp\.experts\.gate_up_proj'.*Export it without fake mode"):
        export_hf(tmp_path / "source", tmp_path / "out", task="text-generation", fake=True)
    assert not (tmp_path / "out").exists()
