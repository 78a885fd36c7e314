"""Causal LMs without a decode step export-hf can write: a decode step whose capture fails is
run in eager PyTorch, and the model's own failure on it is the error export-hf gives, naming
the model's code; an assistant that reuses its target's keys and values and a decoder of audio
codebooks (Musicgen) are refused. Nothing is written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.decoders import decode_step
from fx2onnx.hub.decoders.own_decode_step import DecodeStepError, own_decode_step_failure
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.tasks import UnsupportedTaskError

transformers = pytest.importorskip("transformers")


def _cpmant() -> torch.nn.Module:
    # CPM-Ant builds its masks and position bias from this call's tokens only: its forward
    # fails on new tokens after cached ones (transformers 5.24)
    config = transformers.CpmAntConfig(vocab_size=100, hidden_size=16, dim_ff=32, num_attention_heads=2, dim_head=8,
                                       num_hidden_layers=1, prompt_length=4, prompt_types=4, segment_types=4)
    torch.manual_seed(0)
    return transformers.CpmAntForCausalLM(config).eval()


def _llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1)
    return transformers.LlamaForCausalLM(config).eval()


def test_the_models_own_failure_on_a_decode_step_is_named_and_none_when_it_runs() -> None:
    model = _cpmant()
    failure = own_decode_step_failure(LoadedModel(model, model.config, Path("."), "text-generation", None))
    assert isinstance(failure, DecodeStepError) and isinstance(failure, UnsupportedTaskError)  # a refusal
    assert str(failure).startswith("CpmAntForCausalLM's own forward fails in eager PyTorch on a decode step")
    assert "must match the size of tensor" in str(failure)  # the model's own error, quoted
    # and the line of its code that raised it
    assert re.search(r"raised at transformers/models/cpmant/modeling_cpmant\.py:\d+ in forward "
                     r"\(`score = score \+ position_bias`\)", str(failure))
    llama = _llama()
    assert own_decode_step_failure(LoadedModel(llama, llama.config, Path("."), "text-generation", None)) is None


def test_export_hf_gives_the_models_own_failure_and_writes_nothing(tmp_path: Path) -> None:
    _cpmant().save_pretrained(tmp_path / "source")
    with pytest.raises(DecodeStepError, match="own forward fails in eager PyTorch on a decode step"):
        export_hf(tmp_path / "source", tmp_path / "out", task="text-generation")
    assert not (tmp_path / "out").exists()


def test_an_assistant_reusing_its_targets_keys_and_values_is_refused(tmp_path: Path) -> None:
    # every layer of Gemma 4's assistant reads its target model's keys and values: no decode step of its own
    from fx2onnx.hub.tasks import UnsupportedTaskError

    text = {"vocab_size": 100, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "hidden_size_per_layer_input": 0,
            "vocab_size_per_layer_input": 0, "enable_moe_block": False, "use_double_wide_mlp": False,
            "layer_types": ["sliding_attention", "full_attention"]}
    config = transformers.Gemma4AssistantConfig(text_config=text, backbone_hidden_size=16)
    transformers.Gemma4AssistantForCausalLM(config).save_pretrained(tmp_path / "source")
    with pytest.raises(UnsupportedTaskError, match=r"reuses another model's keys and values in each of its 2 layers"):
        export_hf(tmp_path / "source", tmp_path / "out", task="text-generation")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["Musicgen", "MusicgenMelody"])
def test_a_decoder_of_audio_codebooks_is_refused_naming_rows_and_delay_pattern(tmp_path: Path, kind: str) -> None:
    # input_ids of batch x codebooks rows against a mask of batch rows, and a delay pattern in generation
    from fx2onnx.hub.tasks import UnsupportedTaskError

    config = getattr(transformers, f"{kind}DecoderConfig")(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                                           num_attention_heads=2, ffn_dim=32, num_codebooks=3)
    getattr(transformers, f"{kind}ForCausalLM")(config).save_pretrained(tmp_path / "source")
    with pytest.raises(UnsupportedTaskError, match=r"rows must be a multiple of num_codebooks=3 .*delay pattern"):
        export_hf(tmp_path / "source", tmp_path / "out", task="text-generation")
    assert not (tmp_path / "out").exists()
    llama = _llama()
    assert decode_step.codebooks(llama.config) is None


def _deepseek_v4() -> torch.nn.Module:
    # one compressed-sparse-attention layer: its cache counts the windows it has compressed (entry_count)
    config = transformers.DeepseekV4Config(
        vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        q_lora_rank=16, o_lora_rank=16, o_groups=2, index_n_heads=2, index_head_dim=8, index_topk=4,
        moe_intermediate_size=16, n_routed_experts=2, num_experts_per_tok=1, layer_types=["compressed_sparse_attention"],
        mlp_layer_types=["hash_moe"], max_position_embeddings=64, sliding_window=64, qk_rope_head_dim=2,
        partial_rotary_factor=0.25)
    torch.manual_seed(0)
    return transformers.DeepseekV4ForCausalLM(config).eval()


def test_a_cache_counting_its_tokens_in_python_numbers_is_refused() -> None:
    from fx2onnx.hub.decoders.cache_counters import counted_numbers, counter_refusal

    # DeepSeek-V4's layers count in Python numbers: export-hf takes them from the past length in a step
    # of its own (compressed_attention.py), so its cache is the example of the refusal any other such cache gets
    model = _deepseek_v4()
    loaded = LoadedModel(model, model.config, Path("."), "text-generation", None)
    refusal = counter_refusal(loaded, decode_step.decode_step_inputs(loaded))
    assert refusal is not None and re.search(
        r"counts what its cache has seen in Python numbers: DeepseekV4CSACache\.entry_count, read by "
        r"DeepseekV4HCACache\.store_compression_weights \(`first_window_position = self\.entry_count\[name\] "
        r"\* self\.compress_rate`\); DeepseekV4HCACache\.update_compressor_states .*\(they differ after "
        r"prefills of 5 and 23 tokens\).*Nothing was written", str(refusal))
    # a cache of keys and values alone counts nothing in Python numbers (a sliding layer's count is rebuilt)
    config = transformers.MistralConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, sliding_window=4)
    mistral = transformers.MistralForCausalLM(config).eval()
    loaded = LoadedModel(mistral, mistral.config, Path("."), "text-generation", None)
    assert counted_numbers(loaded, decode_step.decode_step_inputs(loaded)) == []


class _CountingLayer:
    def __init__(self) -> None:
        self.seen = 0

    def position(self) -> int:
        return self.seen * 4

    def reset(self) -> None:
        self.seen = 0


class _SubclassedCountingLayer(_CountingLayer):
    def grow(self, tokens: int) -> None:
        self.seen_before = self.seen
        self.seen += tokens


def test_the_lines_reading_a_counted_number_are_named_from_the_layer_and_its_bases() -> None:
    from fx2onnx.hub.decoders.cache_counters import number_readers

    # the subclass's own method first, then the inherited one; setters (__init__, reset) and other names left out
    assert number_readers(_SubclassedCountingLayer, "seen") == [
        "_SubclassedCountingLayer.grow (`self.seen_before = self.seen`)",
        "_CountingLayer.position (`return self.seen * 4`)",
    ]
    assert number_readers(_SubclassedCountingLayer, "seen_before") == [
        "_SubclassedCountingLayer.grow (`self.seen_before = self.seen`)"]
    assert number_readers(_CountingLayer, "unread") == []


class _BranchesOnACount(torch.nn.Module):
    """A Python branch on how many values are positive (Qwen4-Exp's indexer, in small)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        count = torch.nonzero(x > 0).shape[0]
        if count > 2:
            return x * 2
        return x


def test_a_branch_on_tensor_values_is_named_by_the_models_line(tmp_path: Path) -> None:
    import types

    import fx2onnx
    from fx2onnx.hub.shared.value_branch_refusal import ValueBranchError, value_branch_failure

    model = _BranchesOnACount()
    report = tmp_path / "failure.sarif"
    with pytest.raises(fx2onnx.OnnxExporterError) as failed:
        fx2onnx.dynamo_export(model, torch.randn(2, 8), export_options=fx2onnx.ExportOptions(failure_report_path=report))
    loaded = LoadedModel(model, types.SimpleNamespace(model_type="tiny"), Path("."), "text-generation", None)
    error = value_branch_failure(loaded, failed.value, report)
    assert isinstance(error, ValueBranchError)
    message = str(error)
    assert "_BranchesOnACount (tiny) decides a Python branch or size on values computed from tensors at " in message
    assert "test_decode_step_refusals.py:" in message and "in forward (`if count > 2:`)" in message
    assert "GuardOnDataDependentSymNode" in message and "Nothing was written" in message
    assert f"SARIF report is at '{report}'" in message and report.is_file()
    # another failure is not named so
    assert value_branch_failure(loaded, RuntimeError("shapes do not match"), report) is None


def test_a_prefill_that_fails_in_transformers_is_refused_whatever_its_error(tmp_path: Path) -> None:
    # Blt builds its cache from its own config, which has no layer count (transformers 5.24): an AttributeError
    from fx2onnx.hub.tasks import UnsupportedTaskError

    width = {"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 32}
    config = transformers.BltConfig(
        vocab_size=100, encoder_hash_byte_group_vocab=64, patcher_config={**width, "num_hidden_layers": 1},
        encoder_config={**width, "hidden_size_global": 16}, global_config={**width, "num_hidden_layers": 1},
        decoder_config={**width, "hidden_size_global": 16, "num_hidden_layers": 1})
    transformers.BltForCausalLM(config).save_pretrained(tmp_path / "source")
    with pytest.raises(UnsupportedTaskError, match=(
            r"BltForCausalLM \(blt\) does not run the prefill its decode step is captured after \(5 tokens with "
            r"use_cache=True\): transformers' own forward fails with AttributeError: .*No folder was written")):
        export_hf(tmp_path / "source", tmp_path / "out", task="text-generation")
    assert not (tmp_path / "out").exists()


def test_a_cache_keeping_state_outside_its_layers_is_refused_before_capture() -> None:
    # MiniMax keeps its lightning-attention states in MiniMaxCache.linear_cache, beside the cache's layers
    config = transformers.MiniMaxConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_local_experts=2,
                                        num_experts_per_tok=1, block_size=4,
                                        layer_types=["linear_attention", "full_attention"])
    torch.manual_seed(0)
    model = transformers.MiniMaxForCausalLM(config).eval()
    with pytest.raises(UnsupportedTaskError, match=r"outside its cache's layers \(MiniMaxCache\.linear_cache\).*"
                                                   r"No folder was written"):
        decode_step.decode_step_inputs(LoadedModel(model, config, Path("."), "text-generation", None))
    llama = _llama()  # a cache whose every state is in its layers
    inputs = decode_step.decode_step_inputs(LoadedModel(llama, llama.config, Path("."), "text-generation", None))
    assert isinstance(inputs[decode_step.cache_argument(llama)], transformers.DynamicCache)
