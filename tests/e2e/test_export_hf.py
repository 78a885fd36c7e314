"""`fx2onnx export-hf`: transformers models to folders that their runtime runs as they are.

Causal LMs run in ONNX Runtime GenAI (`og.Model(folder)`): greedy tokens equal
`model.generate(do_sample=False)`, and its tokenizer encodes as transformers does.
Encoders and image classifiers match transformers at two input sizes."""

from __future__ import annotations

import collections
import importlib
import json
import os
import re

import onnx
import pytest
import torch

from conftest import all_nodes
from fx2onnx.cli.main import main
from fx2onnx.hub import export_hf
from fx2onnx.hub.shared.verification import greedy_in_genai, tolerance_for

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

PROMPT = "the quick brown fox"
COMMON = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)
DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               max_position_embeddings=256)


def causal_configs(vocab: int) -> dict:
    return {
        "llama": transformers.LlamaConfig(**DECODER, vocab_size=vocab, **COMMON),
        "mistral": transformers.MistralConfig(**DECODER, vocab_size=vocab, **COMMON),
        "qwen2": transformers.Qwen2Config(**DECODER, vocab_size=vocab, **COMMON),
        "qwen3": transformers.Qwen3Config(**DECODER, head_dim=16, vocab_size=vocab, **COMMON),
        "phi3": transformers.Phi3Config(**DECODER, vocab_size=vocab, **COMMON),
        "gemma": transformers.GemmaConfig(**DECODER, head_dim=16, vocab_size=vocab, **COMMON),
        "gpt2": transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=256, vocab_size=vocab, **COMMON),
        "mixtral": transformers.MixtralConfig(**DECODER, num_local_experts=4, num_experts_per_tok=2, vocab_size=vocab, **COMMON),
        "qwen2_moe": transformers.Qwen2MoeConfig(**DECODER, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                                 shared_expert_intermediate_size=64, vocab_size=vocab, **COMMON),
    }


@pytest.fixture(scope="module")
def tokenizer():
    """A byte-level BPE tokenizer trained here (nothing downloaded)."""
    model = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()
    )
    model.train_from_iterator(["the quick brown fox jumps over the lazy dog", "hello world of onnx models"] * 40, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=model, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def save_causal_lm(folder, family: str, tokenizer) -> torch.nn.Module:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(causal_configs(len(tokenizer))[family]).eval()
    model.save_pretrained(folder, max_shard_size="200KB")
    tokenizer.save_pretrained(folder)
    return model


def genai_greedy(model, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """Greedy tokens of ONNX Runtime GenAI's `model` (an `og.Model`) after the prompt's ids."""
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai does not install on this platform")
    return greedy_in_genai(model, [prompt_ids], new_tokens, ends_early=True).tokens[0]


def generate_with_genai(folder, prompt_ids: list[int], new_tokens: int) -> tuple[list[int], list[int]]:
    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai does not install on this platform")
    model = og.Model(str(folder))
    encoded = list(og.Tokenizer(model).encode(PROMPT))
    return genai_greedy(model, prompt_ids, new_tokens), [int(t) for t in encoded]


def dims(path, name: str) -> list:
    model = onnx.load(os.fspath(path), load_external_data=False)
    value = next(v for v in [*model.graph.input, *model.graph.output] if v.name == name)
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def data_locations(path) -> set[str]:
    """The external-data file names written in a model's graph (where onnxruntime-web looks)."""
    model = onnx.load(os.fspath(path), load_external_data=False)
    return {entry.value for t in model.graph.initializer for entry in t.external_data if entry.key == "location"}


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gpt2", "mixtral", "qwen2_moe"])
def test_causal_lm_folder_runs_in_onnxruntime_genai(tmp_path, family, tokenizer):
    model = save_causal_lm(tmp_path / "source", family, tokenizer)
    said = []
    result = export_hf(tmp_path / "source", tmp_path / "out", verify=True, say=said.append)
    out = tmp_path / "out"
    assert {"onnx/model.onnx", "onnx/model.onnx_data", "genai_config.json", "config.json", "tokenizer.json", "tokenizer_config.json"} <= set(result.files)
    # the same folder for every family; the one Transformers.js 4.3.2 has no class for is named
    notes = [line for line in said if "cannot load this folder" in line]
    assert notes == (["Transformers.js 4.3.2 cannot load this folder: it has no text-generation class for model type "
                      "mixtral (Unsupported model type: mixtral). It is for onnxruntime and ONNX Runtime GenAI."]
                     if family == "mixtral" else [])
    onnx.checker.check_model(os.fspath(out / "onnx" / "model.onnx"), full_check=True)
    assert result.verification.passed and result.verification.tokens_equal  # logits within float32's tolerance
    # where Transformers.js looks: onnx/model.onnx, its weights in model.onnx_data as the graph says, flagged in config.json
    assert data_locations(out / "onnx" / "model.onnx") == {"model.onnx_data"}
    assert json.loads((out / "config.json").read_text())["transformers.js_config"] == {"use_external_data_format": True, "dtype": "fp32"}
    assert json.loads((out / "genai_config.json").read_text())["model"]["decoder"]["filename"] == "onnx/model.onnx"
    assert dims(out / "onnx" / "model.onnx", "input_ids") == ["batch_size", "sequence_length"]
    assert dims(out / "onnx" / "model.onnx", "attention_mask") == ["batch_size", "total_sequence_length"]
    assert dims(out / "onnx" / "model.onnx", "past_key_values.1.value")[::2] == ["batch_size", "past_sequence_length"]
    assert dims(out / "onnx" / "model.onnx", "present.0.key")[::2] == ["batch_size", "total_sequence_length"]
    config = json.loads((out / "genai_config.json").read_text())
    # opset 23 by default: attention and the rotary embedding as single kernels; attention
    # over the cache as onnxruntime's GroupQueryAttention, which appends to the cache in
    # place (past and present share a buffer); a sliding window (Mistral's) is the kernel's
    assert config["model"]["decoder"]["num_hidden_layers"] == 2
    assert config["search"]["past_present_share_buffer"] is True
    nodes = list(all_nodes(onnx.load(os.fspath(out / "onnx" / "model.onnx"), load_external_data=False)))
    kernels = collections.Counter(node.op_type for node in nodes)
    # (with GroupQueryAttention, twice a layer: without the attention bias for unpadded
    # batches, with it for padded ones; the standard Attention in the other branch of its
    # If, for the steps onnxruntime's kernel refuses)
    assert (kernels["GroupQueryAttention"], kernels["Attention"]) == (4, 2)
    assert kernels["MoE"] == (2 if family in ("mixtral", "qwen2_moe") else 0)  # the experts, onnxruntime's kernel
    windows = [a.i for node in nodes if node.op_type == "GroupQueryAttention" for a in node.attribute if a.name == "local_window_size"]
    assert windows == ([4096] * 4 if family == "mistral" else [])
    assert kernels["RotaryEmbedding"] == (0 if family == "gpt2" else 4)
    # each residual Add and the RMS norm of its sum as one kernel: after the attention of
    # both layers, before the second and before the head (the first norm reads the embedding)
    assert kernels["SkipSimplifiedLayerNormalization"] == (0 if family == "gpt2" else 4)
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    tokens, encoded = generate_with_genai(out, prompt_ids, 16)
    assert encoded == prompt_ids
    with torch.no_grad():
        expected = model.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=16, min_new_tokens=16, pad_token_id=0)
    assert tokens == expected[0, len(prompt_ids):].tolist()


def test_fake_mode_streams_the_weights_from_the_folder(tmp_path, tokenizer):
    model = save_causal_lm(tmp_path / "source", "llama", tokenizer)
    result = export_hf(tmp_path / "source", tmp_path / "out", fake=True, verify=True)
    assert result.verification.tokens_equal
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    tokens, _ = generate_with_genai(tmp_path / "out", prompt_ids, 8)
    with torch.no_grad():
        expected = model.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=8, min_new_tokens=8, pad_token_id=0)
    assert tokens == expected[0, len(prompt_ids):].tolist()


def save_encoder(folder, kind: str, tokenizer) -> None:
    """A two-layer BERT (feature-extraction) or ViT (image-classification) in ``folder``."""
    torch.manual_seed(0)
    if kind == "bert":
        config = transformers.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                         vocab_size=len(tokenizer), max_position_embeddings=64)
        model = transformers.BertModel(config).eval()
        tokenizer.save_pretrained(folder)
    else:
        config = transformers.ViTConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                        image_size=32, patch_size=8, num_labels=5)
        model = transformers.ViTForImageClassification(config).eval()
    model.save_pretrained(folder)


@pytest.mark.parametrize("kind", ["bert", "vit"])
def test_encoder_and_image_classifier_folders(tmp_path, kind, tokenizer):
    save_encoder(tmp_path / "source", kind, tokenizer)
    result = export_hf(tmp_path / "source", tmp_path / "out", verify=True)
    assert result.task == ("feature-extraction" if kind == "bert" else "image-classification")
    assert result.verification.passed and result.verification.max_logit_difference < 1e-4  # at two input sizes
    path = tmp_path / "out" / "onnx" / "model.onnx"
    onnx.checker.check_model(os.fspath(path), full_check=True)
    if kind == "bert":
        assert dims(path, "input_ids") == ["batch_size", "sequence_length"]
        assert dims(path, "last_hidden_state") == ["batch_size", "sequence_length", 64]
    else:
        assert dims(path, "pixel_values")[0] == "batch_size" and dims(path, "logits") == ["batch_size", 5]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dtype_of_the_export(tmp_path, tokenizer, dtype):
    save_causal_lm(tmp_path / "source", "llama", tokenizer)
    result = export_hf(tmp_path / "source", tmp_path / "out", dtype=dtype, fake=True, verify=True, tokens=6)
    # tokens equal, logits within the dtype's tolerance (bfloat16: the folder computed in
    # float32 by onnxruntime, which has no bfloat16 CPU kernels, against PyTorch in bfloat16)
    assert result.verification.passed and result.verification.tokens_equal
    assert result.verification.tolerance == tolerance_for(getattr(torch, dtype))
    name = "model_fp16.onnx" if dtype == "float16" else "model.onnx"  # Transformers.js's dtype suffix
    assert json.loads((tmp_path / "out" / "config.json").read_text())["transformers.js_config"]["dtype"] == (
        "fp16" if dtype == "float16" else "fp32")
    weights = onnx.load(os.fspath(tmp_path / "out" / "onnx" / name), load_external_data=False).graph.initializer
    assert {t.data_type for t in weights if t.name.endswith("proj.weight")} == {getattr(onnx.TensorProto, dtype.upper())}


SEQ2SEQ_COMMON = dict(vocab_size=100, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)


def seq2seq_model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "t5":
        config = transformers.T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, **SEQ2SEQ_COMMON)
        return transformers.T5ForConditionalGeneration(config).eval()
    if kind == "bart":
        config = transformers.BartConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                         decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                         max_position_embeddings=64, **SEQ2SEQ_COMMON)
        return transformers.BartForConditionalGeneration(config).eval()
    config = transformers.WhisperConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
                                        max_source_positions=16, max_target_positions=32, **SEQ2SEQ_COMMON)
    return transformers.WhisperForConditionalGeneration(config).eval()


@pytest.mark.parametrize(
    ("kind", "fake"), [("t5", False), ("bart", False), ("whisper", False), ("t5", True), ("bart", True), ("whisper", True)]
)
def test_encoder_decoder_folders(tmp_path, kind, fake):
    seq2seq_model(kind).save_pretrained(tmp_path / "source", max_shard_size="50KB")
    # Whisper in Optimum's layout is --runtime standard (onnxruntime's is ONNX Runtime GenAI's, test_whisper_genai.py)
    runtime = "standard" if kind == "whisper" else "onnxruntime"
    result = export_hf(tmp_path / "source", tmp_path / "out", verify=True, fake=fake, tokens=6, runtime=runtime)
    assert result.task == ("automatic-speech-recognition" if kind == "whisper" else "text2text-generation")
    # greedy decoding at two encoder input sizes, the two files as the runtime chains them: the
    # merged decoder's first step with use_cache_branch false and an empty past, then with the past
    assert result.verification.passed and result.verification.max_logit_difference < 1e-4
    out = tmp_path / "out" / "onnx"
    assert set(result.files) >= {"onnx/encoder_model.onnx", "onnx/encoder_model.onnx_data", "onnx/decoder_model_merged.onnx",
                                 "onnx/decoder_model_merged.onnx_data"}
    assert sorted(p.name for p in out.iterdir()) == ["decoder_model_merged.onnx", "decoder_model_merged.onnx_data",
                                                     "encoder_model.onnx", "encoder_model.onnx_data"]
    for name in ("encoder_model.onnx", "decoder_model_merged.onnx"):
        onnx.checker.check_model(os.fspath(out / name), full_check=True)
    first_input = "input_features" if kind == "whisper" else "input_ids"
    assert dims(out / "encoder_model.onnx", first_input)[0] == "batch_size"
    assert dims(out / "encoder_model.onnx", "last_hidden_state")[0] == "batch_size"
    merged = out / "decoder_model_merged.onnx"
    assert dims(merged, "input_ids") == ["batch_size", "sequence_length"] and dims(merged, "use_cache_branch") == [1]
    assert dims(merged, "past_key_values.0.decoder.key")[::2] == ["batch_size", "past_sequence_length"]
    assert dims(merged, "present.1.decoder.value")[::2] == ["batch_size", "total_sequence_length"]
    assert dims(merged, "past_key_values.0.encoder.key")[::2] == ["batch_size", "encoder_sequence_length"]
    graph = onnx.load(os.fspath(merged), load_external_data=False).graph
    assert data_locations(merged) == {"decoder_model_merged.onnx_data"}
    assert data_locations(out / "encoder_model.onnx") == {"encoder_model.onnx_data"}
    assert [node.op_type for node in graph.node] == ["If"] and {"logits", "present.0.encoder.key"} <= {o.name for o in graph.output}


def test_command_line_and_its_errors(tmp_path, tokenizer, capsys):
    save_causal_lm(tmp_path / "source", "llama", tokenizer)
    assert main(["export-hf", str(tmp_path / "source"), "--output", str(tmp_path / "out"), "--verify", "--quiet"]) == 0
    assert (tmp_path / "out" / "genai_config.json").is_file()
    # an existing folder that is not empty is never mixed with
    assert main(["export-hf", str(tmp_path / "source"), "--output", str(tmp_path / "out"), "--quiet"]) == 2
    assert "give a new or empty folder; nothing was written" in capsys.readouterr().err
    assert main(["export-hf", str(tmp_path / "nowhere"), "--output", str(tmp_path / "o2"), "--quiet"]) == 1
    assert "does not exist" in capsys.readouterr().err and not (tmp_path / "o2").exists()
    assert main(["export-hf", str(tmp_path / "source"), "--output", str(tmp_path / "o3"), "--task", "image-classification", "--quiet"]) == 1
    assert not (tmp_path / "o3").exists()  # a LLaMA folder is no image classifier: nothing written
    # a tolerance without --verify, or a negative one, is a usage error before any export
    assert main(["export-hf", str(tmp_path / "source"), "--output", str(tmp_path / "o4"), "--rtol", "1e-2", "--quiet"]) == 2
    assert "--rtol and --atol are the tolerance of --verify" in capsys.readouterr().err
    assert main(["export-hf", str(tmp_path / "source"), "--output", str(tmp_path / "o4"), "--verify", "--atol", "-1", "--quiet"]) == 2
    assert "must not be negative" in capsys.readouterr().err and not (tmp_path / "o4").exists()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]  # no half-written folder left


def plant_error(path, error: float) -> list[str]:
    """Add ``error`` to the model's logits and hidden states in the saved file ``path``: a
    fault the verification must see. Returns the outputs changed."""
    model = onnx.load(os.fspath(path), load_external_data=False)
    changed = []
    for output in model.graph.output:
        if output.name not in ("logits", "last_hidden_state"):
            continue
        clean = f"{output.name}.before_planted_error"
        for node in model.graph.node:
            node.output[:] = [clean if name == output.name else name for name in node.output]
        constant = onnx.helper.make_tensor(f"{output.name}.planted_error", output.type.tensor_type.elem_type, [], [error])
        model.graph.initializer.append(constant)
        model.graph.node.append(onnx.helper.make_node("Add", [clean, constant.name], [output.name]))
        changed.append(output.name)
    onnx.save(model, os.fspath(path))  # the weights stay in the folder's external data files
    return changed


@pytest.mark.parametrize("kind", ["bert", "vit", "llama", "t5"])
def test_verify_fails_on_a_planted_error_for_every_task(tmp_path, kind, tokenizer, monkeypatch, capsys):
    """1e-2 added to the folder's outputs before the verification runs: `--verify` exits 1 for
    each task. For the LLaMA the greedy tokens stay equal (a constant added to every logit
    keeps the argmax): the logits' difference alone fails it."""
    if kind == "llama":
        save_causal_lm(tmp_path / "source", "llama", tokenizer)
    elif kind == "t5":
        seq2seq_model("t5").save_pretrained(tmp_path / "source")
    else:
        save_encoder(tmp_path / "source", kind, tokenizer)
    module = importlib.import_module("fx2onnx.hub.export_hf")
    verify, planted = module._verify, []

    def verify_with_an_error(loaded, folder, *args, **kwargs):
        for path in sorted(folder.rglob("*.onnx")):  # wherever the folder keeps its models
            planted.extend(plant_error(path, 1e-2))
        return verify(loaded, folder, *args, **kwargs)

    monkeypatch.setattr(module, "_verify", verify_with_an_error)
    command = ["export-hf", str(tmp_path / "source"), "--output", str(tmp_path / "out"), "--verify", "--quiet", "--tokens", "4"]
    assert main(command) == 1
    err = capsys.readouterr().err
    # 0.01 where the error is added to the result; T5's decoder carries its encoder's further
    assert planted and re.search(r"verification failed: largest difference 0\.0\d*( after \d+ tokens)? \([\d.]+ times the tolerance rtol=0\.001, atol=0\.0001\)", err), err
    if kind in ("llama", "t5"):
        assert "greedy tokens equal" in err
    if kind == "bert":  # a tolerance given on the command line is the one applied
        planted.clear()
        assert main([*command[:3], str(tmp_path / "out2"), *command[4:], "--atol", "2e-2"]) == 0
        assert planted == ["last_hidden_state"]


def test_runtime_standard_keeps_to_onnx_operators_and_runs_any_batch(tmp_path, tokenizer):
    """`--runtime standard`: the portable target (attention decomposed into ONNX operators,
    no functions) and a cache grown by Concat, which run several new tokens over a cache
    for several sequences at once."""
    import numpy as np
    import onnxruntime as ort

    model = save_causal_lm(tmp_path / "source", "llama", tokenizer)
    out = tmp_path / "out"
    assert main(["export-hf", str(tmp_path / "source"), "--output", str(out), "--runtime", "standard", "--verify", "--quiet"]) == 0
    assert json.loads((out / "genai_config.json").read_text())["search"]["past_present_share_buffer"] is False
    onnx.checker.check_model(os.fspath(out / "onnx" / "model.onnx"), full_check=True)
    kernels = collections.Counter(node.op_type for node in all_nodes(onnx.load(os.fspath(out / "onnx" / "model.onnx"), load_external_data=False)))
    assert not {"Attention", "RotaryEmbedding", "GroupQueryAttention"} & set(kernels) and kernels["Softmax"] == 2
    ids = torch.randint(3, len(tokenizer), (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = model(input_ids=ids[:, :5], use_cache=True).past_key_values
        expected = model(input_ids=ids).logits[:, 5:]
    feed = {"input_ids": ids[:, 5:].numpy(), "attention_mask": np.ones((2, 8), np.int64),
            "position_ids": np.tile(np.arange(5, 8), (2, 1))}
    for i, layer in enumerate(cache.layers):
        feed[f"past_key_values.{i}.key"], feed[f"past_key_values.{i}.value"] = layer.keys.numpy(), layer.values.numpy()
    session = ort.InferenceSession(os.fspath(out / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], {i.name: feed[i.name] for i in session.get_inputs()})[0]
    np.testing.assert_allclose(logits, expected.numpy(), rtol=1e-4, atol=1e-4)


def test_multi_query_cache_and_small_integer_constants(tmp_path, tokenizer):
    """Falcon: one key/value head for all query heads (the config names it its own way;
    the folder's config takes the cache's heads and head size from the model), and small
    integer constants used as slice bounds (kept in the model file, where onnxruntime
    reads shape inputs)."""
    torch.manual_seed(0)
    config = transformers.FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=len(tokenizer),
                                       max_position_embeddings=256, **COMMON)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(tmp_path / "source")
    tokenizer.save_pretrained(tmp_path / "source")
    result = export_hf(tmp_path / "source", tmp_path / "out", verify=True, tokens=8)
    assert result.verification.tokens_equal
    decoder = json.loads((tmp_path / "out" / "genai_config.json").read_text())["model"]["decoder"]
    assert (decoder["num_key_value_heads"], decoder["head_size"]) == (1, 16)
    # ONNX Runtime GenAI reads the graph with a separate key and value (tests/e2e/test_transformers_js.py)
    assert dims(tmp_path / "out" / "onnx" / "model_separate_cache.onnx", "past_key_values.0.key")[1::2] == [1, 16]
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    tokens, _ = generate_with_genai(tmp_path / "out", prompt_ids, 8)
    with torch.no_grad():
        expected = model.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=8, min_new_tokens=8, pad_token_id=0)
    assert tokens == expected[0, len(prompt_ids):].tolist()
