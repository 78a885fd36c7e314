"""The configuration files export-hf writes, on tiny configs without an export: ONNX
Runtime GenAI's sections written once (session options, token ids, search) and used by
the causal LM's and Whisper's genai_config.json; the folder's file names."""

from __future__ import annotations

import json
from types import SimpleNamespace

import onnx_ir as ir
import pytest
import torch
from transformers import GenerationConfig, LlamaConfig, RoCBertConfig, WhisperConfig

from fx2onnx.hub.decoders.decoder_types import GENERIC_DECODER, genai_decoder_type
from fx2onnx.hub.shared import folder_layout
from fx2onnx.hub.shared.genai_config import genai_config, search_options, session_options, token_ids
from fx2onnx.hub.shared.json_files import write_json_file
from fx2onnx.hub.whisper.whisper_config import whisper_genai_config

SESSION = {"log_id": "onnxruntime-genai", "provider_options": []}


def _decoder(layers: int, kv_heads: int, head_size: int) -> ir.Model:
    """A graph with a decoder's inputs only: what genai_config reads of the model."""
    def value(name: str, shape: list) -> ir.Value:
        return ir.Value(name=name, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(shape))

    inputs = [value("input_ids", ["batch", "seq"]), value("attention_mask", ["batch", "total"])]
    for layer in range(layers):
        inputs += [value(f"past_key_values.{layer}.{kind}", ["batch", kv_heads, "past", head_size]) for kind in ("key", "value")]
    return ir.Model(ir.Graph(inputs, [], nodes=[]), ir_version=10)


def test_a_causal_lms_config_has_the_shared_sections():
    config = LlamaConfig(hidden_size=16, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, vocab_size=40,
                         bos_token_id=1, eos_token_id=2, max_position_embeddings=64)
    written = genai_config(config, None, "onnx/model.onnx", _decoder(3, 2, 4))
    decoder = written["model"]["decoder"]
    assert decoder["session_options"] == session_options() == SESSION
    assert (decoder["num_hidden_layers"], decoder["num_key_value_heads"], decoder["head_size"]) == (3, 2, 4)
    assert "position_ids" not in decoder["inputs"] and written["model"]["type"] == "llama"
    assert {k: written["model"][k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")} == token_ids(config, None)
    # no GroupQueryAttention updates the cache: the buffers are not shared
    assert written["search"] == search_options(64, False) and written["search"]["max_length"] == 64


def test_a_model_without_a_bos_token_gets_its_decoder_start_or_pad():
    """ONNX Runtime GenAI refuses a genai_config.json whose bos_token_id is null."""
    pegasus = SimpleNamespace(bos_token_id=None, pad_token_id=0, eos_token_id=1, decoder_start_token_id=5)
    assert token_ids(pegasus, None) == {"bos_token_id": 5, "eos_token_id": 1, "pad_token_id": 0}
    roc_bert = SimpleNamespace(pad_token_id=3, eos_token_id=2)  # no bos, no decoder start
    assert token_ids(roc_bert, None) == {"bos_token_id": 3, "eos_token_id": 2, "pad_token_id": 3}


def test_a_model_without_an_eos_token_gets_an_empty_list_of_them():
    """ONNX Runtime GenAI refuses a genai_config.json whose eos_token_id is null; an empty
    list ends no sequence early, as transformers' generation without an eos token."""
    roc_bert = RoCBertConfig(pad_token_id=3)  # RoCBERT's config has no bos or eos token
    assert getattr(roc_bert, "eos_token_id", None) is None
    generation = GenerationConfig.from_model_config(roc_bert)
    assert token_ids(roc_bert, generation) == {"bos_token_id": 3, "eos_token_id": [], "pad_token_id": 3}


def test_token_ids_prefer_the_generation_config_and_pad_with_eos():
    config = SimpleNamespace(bos_token_id=1, eos_token_id=2, pad_token_id=None)
    assert token_ids(config, None) == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    generation = SimpleNamespace(bos_token_id=5, eos_token_id=[6, 7], pad_token_id=None)
    assert token_ids(config, generation) == {"bos_token_id": 5, "eos_token_id": [6, 7], "pad_token_id": 6}


def test_whispers_config_uses_the_same_sections():
    config = WhisperConfig(d_model=8, encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
                           decoder_attention_heads=2, vocab_size=32, max_target_positions=24)
    written = whisper_genai_config(config, None, "onnx/encoder.onnx", "onnx/decoder.onnx", 2, 4, 1)
    model = written["model"]
    assert model["decoder"]["session_options"] == model["encoder"]["session_options"] == SESSION
    assert (model["type"], model["context_length"], model["encoder"]["num_hidden_layers"]) == ("whisper", 24, 2)
    assert written["search"]["max_length"] == 24
    assert {k: model[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")} == token_ids(config, None)


@pytest.mark.parametrize(("dtype", "bits", "name", "js"), [
    (torch.float32, None, "onnx/model.onnx", "fp32"), (torch.float16, None, "onnx/model_fp16.onnx", "fp16"),
    (torch.float32, 4, "onnx/model_q4.onnx", "q4"), (torch.float16, 4, "onnx/model_q4f16.onnx", "q4f16"),
    (torch.float32, 8, "onnx/model_quantized.onnx", "q8"),
])
def test_file_names_are_the_ones_transformers_js_asks_for(tmp_path, dtype, bits, name, js):
    assert folder_layout.onnx_file(folder_layout.MODEL, dtype, bits) == name
    assert folder_layout.with_data_file(name) == [name, name + "_data"]
    write_json_file(tmp_path, "config.json", {"model_type": "llama"})
    folder_layout.mark_for_transformers_js(tmp_path / "config.json", dtype, bits)
    marked = json.loads((tmp_path / "config.json").read_text(encoding="utf-8"))
    assert marked == {"model_type": "llama", "transformers.js_config": {"use_external_data_format": True, "dtype": js}}


def test_json_files_are_written_indented_with_a_final_newline(tmp_path):
    assert write_json_file(tmp_path, "genai_config.json", {"a": [1]}) == "genai_config.json"
    assert (tmp_path / "genai_config.json").read_bytes() == b'{\n  "a": [\n    1\n  ]\n}\n'


def test_a_decoder_the_runtime_does_not_name_is_its_generic_decoder():
    assert genai_decoder_type(SimpleNamespace(model_type="qwen3")) == "qwen3"
    # GPT-2's own runtime type expects its former cache layout: the generic decoder reads this one
    assert genai_decoder_type(SimpleNamespace(model_type="gpt2")) == GENERIC_DECODER == "decoder"
    assert genai_decoder_type(SimpleNamespace()) == GENERIC_DECODER
