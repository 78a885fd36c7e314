"""transformers models built in fake mode, saved with the weights of a real model's
`save_pretrained` folder (sharded safetensors), and run equal to that real model."""

from __future__ import annotations

import json
import os
import warnings

import onnx
import onnxruntime as ort
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

import fx2onnx
from conftest import make_options

transformers = pytest.importorskip("transformers")

VOCAB = 96
COMMON = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, use_cache=False)
DECODER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               max_position_embeddings=64)
FAMILIES = {
    "llama": lambda: transformers.LlamaConfig(**DECODER, **COMMON),
    "mistral": lambda: transformers.MistralConfig(**DECODER, **COMMON),
    "qwen2": lambda: transformers.Qwen2Config(**DECODER, **COMMON),
    "gpt_neox": lambda: transformers.GPTNeoXConfig(**{**DECODER, "num_key_value_heads": 4}, **COMMON),
    "gpt2": lambda: transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **COMMON),
    "t5": lambda: transformers.T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, **COMMON),
    "whisper": lambda: transformers.WhisperConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=16, max_target_positions=32,
        **COMMON,
    ),
}


def model_class(family: str) -> type:
    if family == "whisper":
        return transformers.WhisperForConditionalGeneration
    if family == "t5":
        return transformers.T5ForConditionalGeneration
    return transformers.AutoModelForCausalLM


def build(family: str) -> torch.nn.Module:
    config = FAMILIES[family]()
    cls = model_class(family)
    model = cls.from_config(config) if cls is transformers.AutoModelForCausalLM else cls(config)
    return model.eval()


def example_inputs(family: str, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    if family == "whisper":
        return {
            "input_features": torch.randn(1, 8, 32, generator=generator),
            "decoder_input_ids": torch.randint(3, VOCAB, (1, 5), generator=generator),
        }
    ids = torch.randint(3, VOCAB, (1, 7), generator=generator)
    if family == "t5":
        return {"input_ids": ids, "decoder_input_ids": torch.randint(3, VOCAB, (1, 5), generator=generator)}
    return {"input_ids": ids}


def run_file(path, feed: dict[str, torch.Tensor]) -> list:
    session = ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {name: feed[name].numpy() for name in names})


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fake_model_saved_from_a_sharded_save_pretrained_folder(tmp_path, family):
    torch.manual_seed(0)
    real = build(family)
    folder = tmp_path / "checkpoint"
    real.save_pretrained(folder, max_shard_size="40KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # really sharded

    with fx2onnx.enable_fake_mode() as fake_context:
        fake = build(family)
        inputs = {k: torch.zeros_like(v) for k, v in example_inputs(family, seed=0).items()}
    assert all(isinstance(p, FakeTensor) for p in fake.parameters())
    assert not any(isinstance(b, FakeTensor) for b in fake.buffers())
    program = fx2onnx.dynamo_export(fake, **inputs, export_options=make_options(tmp_path, fake_context=fake_context))
    assert not program.has_weight_data

    path = tmp_path / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every name fits, no dtype conversion
        program.save(path, model_state=folder)
    onnx.checker.check_model(os.fspath(path), full_check=True)
    feed = example_inputs(family, seed=1)
    with torch.no_grad():
        expected = real(**feed).logits
    actual = run_file(path, feed)[0]
    torch.testing.assert_close(torch.from_numpy(actual), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["gpt2", "whisper", "llama"])
def test_fake_models_convert_like_real_ones(family):
    with fx2onnx.enable_fake_mode():
        model = build(family)
    tied = family in ("gpt2", "whisper")  # lm_head shares the token embedding
    head = model.get_output_embeddings().weight
    model.half()
    assert {p.dtype for p in model.parameters()} == {torch.float16}
    model.float()
    model.to(torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    model.to(dtype=torch.float32).eval().requires_grad_(False)
    assert not model.training
    assert all(isinstance(p, FakeTensor) and p.dtype == torch.float32 and not p.requires_grad for p in model.parameters())
    # parameters are converted in place: the same objects, ties kept
    assert model.get_output_embeddings().weight is head
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    # buffers are real tensors and converted like any
    assert all(not isinstance(b, FakeTensor) for b in model.buffers())


def test_fake_model_converted_to_half_exports_in_half(tmp_path):
    torch.manual_seed(0)
    real = build("llama")
    with fx2onnx.enable_fake_mode() as fake_context:
        fake = build("llama")
        ids = torch.zeros(1, 7, dtype=torch.int64)
    fake.half()
    program = fx2onnx.dynamo_export(fake, ids, export_options=make_options(tmp_path, fake_context=fake_context))
    declared = {v.dtype for name, v in program.model.graph.initializers.items() if name.endswith("weight")}
    assert declared == {onnx.TensorProto.FLOAT16}
    path = tmp_path / "model.onnx"
    with pytest.warns(UserWarning, match="torch.float32 tensors where the exported model has torch.float16"):
        program.save(path, model_state=real.state_dict())
    onnx.checker.check_model(os.fspath(path), full_check=True)
    feed = example_inputs("llama", seed=1)
    with torch.no_grad():
        expected = real.half()(**feed).logits.float()
    actual = torch.from_numpy(run_file(path, feed)[0]).float()
    # float16 in both: logits up to 0.39 differ by 2.4e-4, one float16 ulp there (eager float16
    # is off float64 by 2.3e-4); one ulp at 1 (2^-10), relative and absolute, admits that
    torch.testing.assert_close(actual, expected, rtol=1e-3, atol=1e-3)
