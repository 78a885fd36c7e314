"""`export-hf` folders in clients nobody on this project wrote, loaded as written.

Transformers.js (`@huggingface/transformers` from npm, in Node): `from_pretrained(folder,
{local_files_only: true})` for causal LMs (greedy tokens equal transformers', prompt by
prompt), BERT feature extraction and ViT image classification (outputs within 1e-5) and
T5 (greedy tokens equal); EXAONE, whose layer count the folder also names as Transformers.js
reads it; hybrid decoders (LFM2, Nemotron-H), whose states take the names Transformers.js feeds; Gemma 4, whose
embedding and decoder Transformers.js loads beside the model; Qwen2-MoE's experts in onnxruntime-node 1.30's
`MoE` kernel; Qwen3.5's text model, GLM-MoE-DSA and ZAYA, whose graphs take positions and caches as
Transformers.js feeds them; the folders export-hf says it cannot load (Mixtral, multi-query Falcon) failing
there as said; ONNX Runtime GenAI on the same causal-LM folders; and each
folder's tokenizer, in Transformers.js and in `og.Tokenizer`, encoding as
`AutoTokenizer.from_pretrained(source)`.

The npm package is installed once into a cache folder (FX2ONNX_TEST_CACHE, default
~/.cache/fx2onnx-tests) with `ONNXRUNTIME_NODE_INSTALL=skip` (onnxruntime-node's install
script fetches CUDA files; its CPU binary is in the package) and reused; the tests are
skipped, saying why, where `node` or `npm` is missing or the registry cannot be reached.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import filelock
import numpy as np
import onnx
import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.shared.tokenizer_files import CHECKED_STRINGS, TokenizerMismatchWarning, check_encodings, file_encoder
from client_versions import TRANSFORMERS_JS_VERSION, npm_cache, transformers_js_folder
from test_export_hf import generate_with_genai, save_causal_lm

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

RUNNER = Path(__file__).with_name("transformers_js_runner.mjs")
PROMPTS = ("the quick brown fox", "hello world of onnx models 42", "the lazy dog jumps over")
NEW_TOKENS = 16


def npm_installed(package: str, version: str, folder: str, minutes: int, env: dict | None = None) -> Path:
    """The npm prefix ``folder`` of the test cache (FX2ONNX_TEST_CACHE, default
    ~/.cache/fx2onnx-tests) holding ``package`` at ``version``, installed there once from the
    registry; the test skipped, saying why, where the install fails or takes over ``minutes``."""
    prefix = npm_cache() / folder
    prefix.mkdir(parents=True, exist_ok=True)
    # the suite's workers (`pytest -n`) share the cache: one installs, the others wait for it
    with filelock.FileLock(f"{prefix}.lock"):
        return _install_once(prefix, package, version, minutes, env)


def _install_once(prefix: Path, package: str, version: str, minutes: int, env: dict | None) -> Path:
    installed = prefix / "node_modules" / package / "package.json"
    if installed.is_file() and json.loads(installed.read_text())["version"] == version:
        return prefix
    (prefix / "package.json").write_text(json.dumps({"name": f"fx2onnx-tests-{prefix.name}", "private": True}) + "\n")
    command = ["npm", "install", "--no-audit", "--no-fund", "--fetch-retries=1", "--prefix", str(prefix), f"{package}@{version}"]
    try:
        done = subprocess.run(command, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=minutes * 60)
    except subprocess.TimeoutExpired:
        pytest.skip(f"`npm install {package}` took over {minutes} minutes: is the npm registry reachable?")
    if done.returncode != 0 or not installed.is_file():
        errors = [line for line in done.stderr.splitlines() if line.startswith("npm error")] or done.stderr.splitlines()
        pytest.skip(f"`npm install {package}@{version}` failed (the npm registry unreachable?): {' / '.join(errors[:3])[:500]}")
    return prefix


@pytest.fixture(scope="session")
def transformers_js() -> Path:
    """The npm prefix holding @huggingface/transformers, installed there once."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Transformers.js tests need Node.js: `node` and `npm` are not on PATH")
    return npm_installed("@huggingface/transformers", TRANSFORMERS_JS_VERSION, transformers_js_folder().name,
                         minutes=10, env={"ONNXRUNTIME_NODE_INSTALL": "skip"})


def node_run(prefix: Path, scratch: Path, job: dict) -> subprocess.CompletedProcess:
    """Run ``job`` with the runner script in Node (its results in ``scratch/result.json``),
    whether it succeeds or not."""
    job_path = scratch / "job.json"
    job_path.write_text(json.dumps(job), encoding="utf-8")
    return subprocess.run(["node", str(RUNNER), str(prefix), str(job_path), str(scratch / "result.json")],
                          capture_output=True, text=True, timeout=300)


def run_in_transformers_js(prefix: Path, scratch: Path, job: dict) -> dict:
    """Run ``job`` with the runner script in Node; its results."""
    done = node_run(prefix, scratch, job)
    assert done.returncode == 0, f"Transformers.js failed on {job['folder']}:\n{done.stderr[-3000:]}"
    return json.loads((scratch / "result.json").read_text(encoding="utf-8"))


def trained_tokenizer():
    """A byte-level BPE tokenizer trained here (nothing downloaded), with merges of digits
    and non-ASCII letters, which a tokenizer class's own pipeline may split differently."""
    model = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = ["the quick brown fox jumps over the lazy dog 42 times in 2024", "hello world of onnx models 1234",
              "naïve café in 東京"]
    model.train_from_iterator(corpus * 40, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=model, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


@pytest.fixture(scope="module")
def tokenizer():
    return trained_tokenizer()


def expected_encodings(source: Path) -> list[list[int]]:
    loaded = transformers.AutoTokenizer.from_pretrained(source)
    return [list(loaded(text)["input_ids"]) for text in CHECKED_STRINGS]


def greedy(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, pad_token_id=0)
    return out[:, ids.shape[1]:].tolist()


def left_padded(prompts: list[list[int]]) -> tuple[list[list[int]], list[list[int]]]:
    width = max(len(p) for p in prompts)
    return [[0] * (width - len(p)) + p for p in prompts], [[0] * (width - len(p)) + [1] * len(p) for p in prompts]


@pytest.mark.parametrize("runtime", ["onnxruntime", "standard"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "phi3"])
def test_causal_lm_folder_in_transformers_js_and_genai(tmp_path, family, runtime, tokenizer, transformers_js):
    model = save_causal_lm(tmp_path / "source", family, tokenizer)
    out = tmp_path / "out"
    export_hf(tmp_path / "source", out, runtime=runtime)
    source_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "source")
    prompts = [list(source_tokenizer(text)["input_ids"]) for text in PROMPTS]
    expected = [greedy(model, torch.tensor([p]), torch.ones(1, len(p), dtype=torch.int64))[0] for p in prompts]
    ids, mask = left_padded(prompts)
    job = {"folder": str(out), "task": "text-generation", "strings": list(CHECKED_STRINGS), "prompts": prompts,
           "new_tokens": NEW_TOKENS, "batch": {"input_ids": ids, "attention_mask": mask}}
    result = run_in_transformers_js(transformers_js, tmp_path, job)
    assert result["encoded"] == expected_encodings(tmp_path / "source")
    assert result["generated"] == expected  # 16 greedy tokens, each prompt alone
    # one left-padded batch, as both libraries pad for generation, in both runtimes' folders
    assert result["batch_generated"] == greedy(model, torch.tensor(ids), torch.tensor(mask))
    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai does not install on this platform")
    genai_tokenizer = og.Tokenizer(og.Model(str(out)))
    assert [list(map(int, genai_tokenizer.encode(text))) for text in CHECKED_STRINGS] == expected_encodings(tmp_path / "source")
    for prompt, tokens in zip(prompts, expected):
        assert generate_with_genai(out, prompt, NEW_TOKENS)[0] == tokens


def test_qwen2_tokenizer_is_written_as_transformers_builds_it(tmp_path, tokenizer):
    """transformers builds a Qwen2 tokenizer's pipeline from its class (digits split one by
    one), not from the source's tokenizer.json: the folder's file encodes as transformers
    does, and the source's file is reported with the string and both encodings."""
    save_causal_lm(tmp_path / "source", "qwen2", tokenizer)
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path / "source")
    with pytest.warns(TokenizerMismatchWarning, match=r"'the lazy fox jumps 42 times in 2024': transformers \[.*\], tokenizer.json \["):
        assert check_encodings(loaded, {"tokenizer.json": file_encoder(tmp_path / "source" / "tokenizer.json")})
    lines = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", TokenizerMismatchWarning)  # the folder's own files: no difference
        export_hf(tmp_path / "source", tmp_path / "out", say=lines.append)
    assert not [line for line in lines if "WARNING" in line]
    written = tokenizers.Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    assert [written.encode(text).ids for text in CHECKED_STRINGS] == expected_encodings(tmp_path / "source")


def test_bert_and_vit_folders_in_transformers_js(tmp_path, tokenizer, transformers_js):
    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=len(tokenizer),
        max_position_embeddings=64)).eval()
    vit = transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8,
        num_labels=5)).eval()
    bert.save_pretrained(tmp_path / "bert")
    tokenizer.save_pretrained(tmp_path / "bert")
    vit.save_pretrained(tmp_path / "vit")
    export_hf(tmp_path / "bert", tmp_path / "bert-onnx")
    export_hf(tmp_path / "vit", tmp_path / "vit-onnx")
    batch = transformers.AutoTokenizer.from_pretrained(tmp_path / "bert")(list(PROMPTS), padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    job = {"folder": str(tmp_path / "bert-onnx"), "task": "feature-extraction", "strings": list(CHECKED_STRINGS),
           "outputs": ["last_hidden_state"],
           "inputs": {name: {"type": "int64", "dims": list(v.shape), "data": v.flatten().tolist()}
                      for name, v in (("input_ids", ids), ("attention_mask", mask))}}
    result = run_in_transformers_js(transformers_js, tmp_path, job)
    assert result["encoded"] == expected_encodings(tmp_path / "bert")
    hidden = result["outputs"]["last_hidden_state"]
    with torch.no_grad():
        expected = bert(input_ids=ids, attention_mask=mask).last_hidden_state
    assert hidden["dims"] == list(expected.shape)
    np.testing.assert_allclose(np.reshape(hidden["data"], hidden["dims"]), expected.numpy(), rtol=0, atol=1e-5)
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    job = {"folder": str(tmp_path / "vit-onnx"), "task": "image-classification", "outputs": ["logits"],
           "inputs": {"pixel_values": {"type": "float32", "dims": list(pixels.shape), "data": pixels.flatten().tolist()}}}
    logits = run_in_transformers_js(transformers_js, tmp_path, job)["outputs"]["logits"]
    with torch.no_grad():
        expected = vit(pixel_values=pixels).logits
    np.testing.assert_allclose(np.reshape(logits["data"], logits["dims"]), expected.numpy(), rtol=0, atol=1e-5)


def test_int8_bert_folder_in_transformers_js(tmp_path, tokenizer, transformers_js):
    """An encoder's int8 folder (MatMulInteger, `model_quantized.onnx`, dtype q8 in
    config.json) as Transformers.js loads it: the outputs onnxruntime gives in Python."""
    import onnxruntime as ort

    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=len(tokenizer),
        max_position_embeddings=64)).eval()
    bert.save_pretrained(tmp_path / "bert")
    tokenizer.save_pretrained(tmp_path / "bert")
    export_hf(tmp_path / "bert", tmp_path / "bert-int8", precision="int8")
    batch = transformers.AutoTokenizer.from_pretrained(tmp_path / "bert")(list(PROMPTS), padding=True, return_tensors="np")
    feed = {"input_ids": batch["input_ids"].astype(np.int64), "attention_mask": batch["attention_mask"].astype(np.int64)}
    job = {"folder": str(tmp_path / "bert-int8"), "task": "feature-extraction", "strings": [], "outputs": ["last_hidden_state"],
           "inputs": {name: {"type": "int64", "dims": list(v.shape), "data": v.flatten().tolist()} for name, v in feed.items()}}
    hidden = run_in_transformers_js(transformers_js, tmp_path, job)["outputs"]["last_hidden_state"]
    session = ort.InferenceSession(str(tmp_path / "bert-int8" / "onnx" / "model_quantized.onnx"), providers=["CPUExecutionProvider"])
    feed["token_type_ids"] = np.zeros_like(feed["input_ids"])
    expected = session.run(["last_hidden_state"], feed)[0]
    np.testing.assert_allclose(np.reshape(hidden["data"], hidden["dims"]), expected, rtol=0, atol=1e-5)


def test_t5_folder_in_transformers_js(tmp_path, tokenizer, transformers_js):
    """T5 as encoder_model.onnx and decoder_model_merged.onnx (the first step without past,
    then the next steps with it, chosen by use_cache_branch): greedy tokens equal transformers'."""
    torch.manual_seed(0)
    config = transformers.T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, vocab_size=len(tokenizer),
                                   pad_token_id=0, eos_token_id=2, decoder_start_token_id=0, tie_word_embeddings=False)
    model = transformers.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():  # T5's initial weights give one token at every step: weights that vary them
        for parameter in model.parameters():
            parameter.normal_(0, 1, generator=torch.Generator().manual_seed(parameter.numel()))
    model.save_pretrained(tmp_path / "source")
    tokenizer.save_pretrained(tmp_path / "source")
    export_hf(tmp_path / "source", tmp_path / "out")
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path / "source")
    prompts = [list(loaded(text)["input_ids"]) for text in PROMPTS]
    job = {"folder": str(tmp_path / "out"), "task": "text2text-generation", "strings": list(CHECKED_STRINGS),
           "prompts": prompts, "new_tokens": NEW_TOKENS}
    result = run_in_transformers_js(transformers_js, tmp_path, job)
    assert result["encoded"] == expected_encodings(tmp_path / "source")
    for prompt, tokens in zip(prompts, result["generated"]):
        with torch.no_grad():
            expected = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW_TOKENS,
                                      min_new_tokens=NEW_TOKENS)
        assert tokens == expected[0, 1:].tolist()
    assert len({t for tokens in result["generated"] for t in tokens}) > 3  # not one token repeated


@pytest.mark.parametrize("quantize_embedding", [False, True])
def test_int4_folder_in_transformers_js(tmp_path, tokenizer, transformers_js, quantize_embedding):
    """An `export-hf --precision int4` folder (MatMulNBits, `onnx/model_q4.onnx`, dtype q4 in
    config.json; the embedding as GatherBlockQuantized on request) loads as written and
    generates what onnxruntime generates on the same file."""
    from fx2onnx.hub.shared.verification import greedy_in_onnxruntime

    save_causal_lm(tmp_path / "source", "llama", tokenizer)
    out = tmp_path / "out"
    export_hf(tmp_path / "source", out, precision="int4", quantize_embedding=quantize_embedding)
    prompts = [list(tokenizer(text)["input_ids"]) for text in PROMPTS]
    job = {"folder": str(out), "task": "text-generation", "strings": [], "prompts": prompts, "new_tokens": NEW_TOKENS}
    result = run_in_transformers_js(transformers_js, tmp_path, job)
    expected = [greedy_in_onnxruntime(out / "onnx" / "model_q4.onnx", prompt, NEW_TOKENS)[0] for prompt in prompts]
    # min_new_tokens keeps Transformers.js from choosing the end token (2): equal up to
    # where onnxruntime's own greedy loop chose it
    ends = [tokens.index(2) if 2 in tokens else len(tokens) for tokens in expected]
    assert [got[:end] for got, end in zip(result["generated"], ends)] == [want[:end] for want, end in zip(expected, ends)]
    assert sum(ends) >= NEW_TOKENS * len(prompts) // 2


def test_module_function_folders_generate_what_flat_ones_generate(tmp_path, tokenizer, transformers_js):
    """An `export-hf --module-functions` folder in Transformers.js and ONNX Runtime GenAI:
    the same greedy tokens as the flat folder's and transformers' (int4 folders with
    module functions: tests/e2e/test_export_hf_precision.py)."""
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai does not install on this platform")
    model = save_causal_lm(tmp_path / "source", "llama", tokenizer)
    prompts = [list(tokenizer(text)["input_ids"]) for text in PROMPTS]
    generated = {}
    for functions in (False, True):
        out = tmp_path / ("functions" if functions else "flat")
        export_hf(tmp_path / "source", out, module_functions=functions)
        files = list(out.rglob("*.onnx"))
        assert files and all(bool(onnx.load(str(path), load_external_data=False).functions) == functions for path in files)
        job = {"folder": str(out), "task": "text-generation", "strings": [], "prompts": prompts, "new_tokens": NEW_TOKENS}
        scratch = tmp_path / f"scratch-{functions}"
        scratch.mkdir()
        in_js = run_in_transformers_js(transformers_js, scratch, job)["generated"]
        in_genai = [generate_with_genai(out, prompt, NEW_TOKENS)[0] for prompt in prompts]
        generated[functions] = (in_js, in_genai)
    assert generated[True] == generated[False]
    expected = [greedy(model, torch.tensor([p]), torch.ones(1, len(p), dtype=torch.int64))[0] for p in prompts]
    assert generated[True][0] == expected and generated[True][1] == expected


TINY_FALCON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, new_decoder_architecture=False,
                   bos_token_id=1, eos_token_id=2, pad_token_id=0)


def test_transformers_js_fails_where_export_hf_says_it_cannot_load(tmp_path, tokenizer, transformers_js):
    """The note export-hf says for a folder Transformers.js cannot load (Mixtral: no class for
    its model type) is Transformers.js's own failure."""
    save_causal_lm(tmp_path / "source", "mixtral", tokenizer)
    said = []
    export_hf(tmp_path / "source", tmp_path / "out", say=said.append)
    notes = [line for line in said if "Transformers.js 4.3.2 cannot load this folder" in line]
    error = "Unsupported model type: mixtral"
    assert len(notes) == 1 and error in notes[0]  # the client's own words
    prompts = [list(tokenizer(PROMPTS[0])["input_ids"])]
    done = node_run(transformers_js, tmp_path, {"folder": str(tmp_path / "out"), "task": "text-generation",
                                                "prompts": prompts, "new_tokens": NEW_TOKENS})
    assert done.returncode != 0 and error in done.stderr, done.stderr[-3000:]


MULTI_QUERY_CONFIGS = {
    "falcon": lambda vocab: transformers.FalconConfig(**TINY_FALCON, vocab_size=vocab, multi_query=False),
    "falcon-multi-query": lambda vocab: transformers.FalconConfig(**TINY_FALCON, vocab_size=vocab, multi_query=True),
    # Falcon-40B's kind: new decoder architecture with 2 key/value heads, multi_query still true
    "falcon-new-decoder": lambda vocab: transformers.FalconConfig(
        **{**TINY_FALCON, "new_decoder_architecture": True}, num_kv_heads=2, vocab_size=vocab, multi_query=True),
    "gpt-bigcode": lambda vocab: transformers.GPTBigCodeConfig(
        n_embd=64, n_layer=2, n_head=4, n_positions=256, multi_query=True, vocab_size=vocab, bos_token_id=1, eos_token_id=2,
        pad_token_id=0),
}


@pytest.mark.parametrize("family", list(MULTI_QUERY_CONFIGS))
def test_multi_query_folders_in_transformers_js_and_genai(tmp_path, family, tokenizer, transformers_js):
    """A config with multi_query: true (Falcon's and GPT-BigCode's defaults): Transformers.js feeds
    one combined key_value cache input per layer, which `onnx/model.onnx` takes; ONNX Runtime
    GenAI reads the separate-cache graph its config names, over the same weights file. Both
    generate transformers' tokens, each prompt alone and (Transformers.js) as a left-padded batch."""
    torch.manual_seed(0)
    config = MULTI_QUERY_CONFIGS[family](len(tokenizer))
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(tmp_path / "source")
    tokenizer.save_pretrained(tmp_path / "source")
    said = []
    out = tmp_path / "out"
    result = export_hf(tmp_path / "source", out, say=said.append, verify=True)
    assert result.verification.passed
    assert not [line for line in said if "cannot load this folder" in line]
    combined = config.multi_query
    graphs = sorted(path.name for path in (out / "onnx").iterdir())
    assert graphs == (["model.onnx", "model.onnx_data", "model_separate_cache.onnx"] if combined
                      else ["model.onnx", "model.onnx_data"])
    genai_file = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]["filename"]
    assert genai_file == ("onnx/model_separate_cache.onnx" if combined else "onnx/model.onnx")
    inputs = {}
    for name in graphs[::2] if combined else graphs[:1]:
        graph = onnx.load(os.fspath(out / "onnx" / name), load_external_data=False)
        onnx.checker.check_model(onnx.load(os.fspath(out / "onnx" / name)), full_check=True)
        # every graph reads the one weights file
        assert {entry.value for tensor in graph.graph.initializer for entry in tensor.external_data
                if entry.key == "location"} == {"model.onnx_data"}
        inputs[name] = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.graph.input}
    separate = inputs["model_separate_cache.onnx" if combined else "model.onnx"]
    batch, heads, past, head_size = separate["past_key_values.1.value"]
    assert (batch, past, head_size) == ("batch_size", "past_sequence_length", 16)
    if combined:  # key and value side by side on the last dim
        assert inputs["model.onnx"]["past_key_values.1.key_value"] == [batch, heads, past, 2 * head_size]
        assert not {"past_key_values.0.key", "past_key_values.0.value"} & set(inputs["model.onnx"])
    prompts = [list(tokenizer(text)["input_ids"]) for text in PROMPTS]
    expected = [greedy(model, torch.tensor([p]), torch.ones(1, len(p), dtype=torch.int64))[0] for p in prompts]
    ids, mask = left_padded(prompts)
    job = {"folder": str(out), "task": "text-generation", "strings": [], "prompts": prompts, "new_tokens": NEW_TOKENS,
           "batch": {"input_ids": ids, "attention_mask": mask}}
    in_js = run_in_transformers_js(transformers_js, tmp_path, job)
    assert in_js["generated"] == expected
    assert in_js["batch_generated"] == greedy(model, torch.tensor(ids), torch.tensor(mask))
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai does not install on this platform")
    assert [generate_with_genai(out, prompt, NEW_TOKENS)[0] for prompt in prompts] == expected


def test_float16_folder_with_its_float32_twin_in_transformers_js(tmp_path, tokenizer, transformers_js):
    """A float16 BERT folder with `float32_twin`: Transformers.js loads `model_fp16.onnx` as
    the config says, and `model.onnx` with dtype "fp32" (what a WebGPU adapter without
    shader-f16 needs), which computes transformers' float16 model in float32."""
    from test_export_hf import save_encoder

    save_encoder(tmp_path / "bert", "bert", tokenizer)
    export_hf(tmp_path / "bert", tmp_path / "bert-fp16", precision="fp16", float32_twin=True)
    files = sorted(p.name for p in (tmp_path / "bert-fp16" / "onnx").iterdir())
    assert files == ["model.onnx", "model.onnx_data", "model_fp16.onnx", "model_fp16.onnx_data"]
    twin = onnx.load(os.fspath(tmp_path / "bert-fp16" / "onnx" / "model.onnx"))
    onnx.checker.check_model(twin, full_check=True)
    float16 = onnx.TensorProto.FLOAT16
    assert not [t.name for t in twin.graph.initializer if t.data_type == float16]
    assert not [v.name for v in [*twin.graph.input, *twin.graph.output] if v.type.tensor_type.elem_type == float16]
    half = onnx.load(os.fspath(tmp_path / "bert-fp16" / "onnx" / "model_fp16.onnx"), load_external_data=False)
    assert half.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # as its clients read it
    config = json.loads((tmp_path / "bert-fp16" / "config.json").read_text(encoding="utf-8"))
    assert config["transformers.js_config"]["dtype"] == "fp16"

    batch = transformers.AutoTokenizer.from_pretrained(tmp_path / "bert")(list(PROMPTS), padding=True, return_tensors="pt")
    inputs = {name: {"type": "int64", "dims": list(batch[name].shape), "data": batch[name].flatten().tolist()}
              for name in ("input_ids", "attention_mask")}
    model = transformers.BertModel.from_pretrained(tmp_path / "bert", dtype=torch.float16).eval()
    with torch.no_grad():
        half = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        widened = model.float()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    for dtype, expected, atol in (("fp32", widened, 1e-4), (None, half.float(), 1e-2)):
        job = {"folder": str(tmp_path / "bert-fp16"), "task": "feature-extraction", "outputs": ["last_hidden_state"],
               "inputs": inputs, **({"dtype": dtype} if dtype else {})}
        hidden = run_in_transformers_js(transformers_js, tmp_path, job)["outputs"]["last_hidden_state"]
        assert hidden["dims"] == list(expected.shape)
        data = np.asarray(hidden["data"])  # float32: the float16 file casts its output (precision/float32_io.py)
        # float16 against eager float16: layer-normalized outputs up to ~4 differ by 3.9e-3
        # where measured (a few float16 ulps, rounded in different places): 1e-2; the twin,
        # float32 throughout, is within the suite's ATOL
        np.testing.assert_allclose(np.reshape(data, hidden["dims"]).astype(np.float32), expected.numpy(), rtol=0, atol=atol)


def test_whisper_folder_in_transformers_js(tmp_path, transformers_js):
    """A large-v3-style Whisper (128 mel bins, multilingual tokenizer, the released suppress
    lists, its first pick on each clip suppressed) as `--runtime standard` writes it
    (`encoder_model.onnx`, `decoder_model_merged.onnx`, `generation_config.json`,
    `preprocessor_config.json`), transcribed in Transformers.js from the samples by its own
    processor and `generate({language: "en", task: "transcribe"})`: transformers' 16 tokens
    on a clip padded with silence and one loud at both ends."""
    from test_whisper_genai import clips, features_of, save_multilingual_whisper

    save_multilingual_whisper(tmp_path / "source")
    out = tmp_path / "out"
    export_hf(tmp_path / "source", out, runtime="standard")
    for name in ("encoder_model.onnx", "decoder_model_merged.onnx"):
        onnx.checker.check_model(os.fspath(out / "onnx" / name), full_check=True)
    samples = list(clips().values())
    options = {"language": "en", "task": "transcribe", "max_new_tokens": NEW_TOKENS}
    job = {"folder": str(out), "task": "automatic-speech-recognition",
           "speech": {"clips": [(clip.astype(np.float32) / 32768).tolist() for clip in samples], "options": options}}
    result = run_in_transformers_js(transformers_js, tmp_path, job)["speech"]
    model = transformers.WhisperForConditionalGeneration.from_pretrained(tmp_path / "source").eval()
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(tmp_path / "source")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "source")
    assert result["prompt"] == tokenizer.convert_tokens_to_ids(["<|startoftranscript|>", "<|en|>", "<|transcribe|>",
                                                                "<|notimestamps|>"])
    first_picks = set()
    for clip, features, generated in zip(samples, result["features"], result["generated"]):
        expected_features = features_of(extractor, clip)
        # Transformers.js's log-mel features against transformers' (float32 FFTs in both)
        np.testing.assert_allclose(np.reshape(features["data"], features["dims"]), expected_features.numpy(), rtol=0, atol=1e-4)
        with torch.no_grad():
            expected = model.generate(expected_features, language="en", task="transcribe", max_new_tokens=NEW_TOKENS)[0].tolist()
            unsuppressed = model.generate(expected_features, language="en", task="transcribe", max_new_tokens=NEW_TOKENS,
                                          suppress_tokens=None, begin_suppress_tokens=None)[0].tolist()
        assert len(expected) == NEW_TOKENS and generated == expected
        first_picks.add(unsuppressed[:1] != expected[:1])  # on one clip, end of text: nothing transcribed
    assert first_picks == {True}  # the suppress lists, read from generation_config.json, chose each first token


VISION_FOLDER_MODELS = ("vision_encoder", "embed_tokens", "decoder_model_merged")


def checked_graphs(out: Path, names: tuple[str, ...] = VISION_FOLDER_MODELS) -> dict[str, onnx.GraphProto]:
    """The folder's models ``names`` (its onnx/ files), each through the checker's full check, by name."""
    graphs = {}
    for name in names:
        path = os.fspath(out / "onnx" / f"{name}.onnx")
        onnx.checker.check_model(path, full_check=True)
        graphs[name] = onnx.load(path, load_external_data=False).graph
    return graphs


def tensor_specs(tensors: dict[str, torch.Tensor]) -> dict[str, dict]:
    """Tensors as the runner's jobs give them (type, dims, data)."""
    kinds = {torch.float32: "float32", torch.bool: "bool"}
    return {name: {"type": kinds.get(value.dtype, "int64"), "dims": list(value.shape),
                   "data": value.flatten().tolist()} for name, value in tensors.items()}


# a user's turn of one image and a question, as a client gives it to the folder's chat template
IMAGE_MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "describe this image"}]}]


def chat_template(image: str, turn: tuple[str, str], generation: str = "") -> str:
    """A chat template writing each turn as ``turn``'s start, its parts (an image as ``image``)
    and ``turn``'s end, then ``generation`` where a generation prompt is asked for."""
    return ("{% for message in messages %}" + turn[0] + "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
            + image + "{% else %}{{ part['text'] }}{% endif %}{% endfor %}" + turn[1] + "{% endfor %}"
            + "{% if add_generation_prompt %}" + generation + "{% endif %}")


# Mistral 3's and LightOnOCR's turns ([INST][IMG]describe this image[/INST]); Idefics3's and SmolVLM's
PIXTRAL_TEMPLATE = chat_template("[IMG]", ("[INST]", "[/INST]"))
IDEFICS3_TEMPLATE = chat_template("<image>", ("User:", "<end_of_utterance>\n"), "Assistant:")


def client_tensors(processed: dict) -> dict[str, torch.Tensor]:
    """Transformers.js's processor outputs (the runner's `processed`) as torch tensors."""
    kinds = {"float32": torch.float32, "bool": torch.bool}
    return {name: torch.tensor(value["data"], dtype=kinds.get(value["type"], torch.int64)).reshape(value["dims"])
            for name, value in processed.items()}


def pixel_difference(client: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    """Transformers.js's processor outputs against transformers' ``expected``: every other
    tensor of ``expected`` (ids, mask, grid) equal, the pixels of the same shape; returns the
    pixels' largest difference."""
    for name, value in expected.items():
        if name != "pixel_values":
            assert client[name].tolist() == value.tolist(), f"{name} differs from transformers'"
    assert client["pixel_values"].shape == expected["pixel_values"].shape
    return float((client["pixel_values"] - expected["pixel_values"]).abs().max())


def save_qwen2_vl(folder):
    """A two-layer Qwen2-VL (two vision layers of full attention within each image) with
    Qwen's tokenizer and the Qwen2.5-VL tests' image processor."""
    from test_export_hf_vision_language import save_qwen

    vision = dict(depth=2, embed_dim=32, num_heads=2, mlp_ratio=2, hidden_size=64, patch_size=14, spatial_merge_size=2,
                  temporal_patch_size=2)
    return save_qwen(folder, transformers.Qwen2VLConfig, transformers.Qwen2VLForConditionalGeneration, vision)


# Qwen's families: the vision model's inputs (Transformers.js's names), the processor Transformers.js's
# AutoProcessor builds, and which of the resized images go in one prompt each
QWEN_FAMILIES = {
    "qwen2_5_vl": (["pixel_values", "image_grid_thw"], "Qwen2_5_VLProcessor", [[1], [2], [1, 2]]),
    "qwen2_vl": (["pixel_values", "grid_thw"], "Qwen2VLProcessor", [[1, 2]]),
}


@pytest.mark.parametrize("family", sorted(QWEN_FAMILIES))
def test_qwen_folder_in_transformers_js(tmp_path, transformers_js, family):
    """Qwen2.5-VL and Qwen2-VL as `--runtime standard` writes them for Transformers.js
    (`vision_encoder`, its grid input named as Transformers.js feeds the family's, `embed_tokens`
    taking `input_ids` alone, `decoder_model_merged`): 16 greedy tokens equal transformers' with
    an image, through the processor Transformers.js's AutoProcessor builds from the folder on the
    folder's chat template with an image it does not resize (transformers' ids, grid and pixels)
    and one it resizes (transformers' ids and grid, sharp's pixels: transformers' tokens on them),
    and on transformers' processed inputs for two images it resizes (no side a multiple of the
    merged patch, grids of other sizes), both in one prompt (one vision run for the two, as
    Transformers.js runs it) and, for Qwen2.5-VL, each alone; a left-padded batch without images
    and one of a tall and a wide image: the first token in Transformers.js, all 16 of each row in
    onnxruntime on transformers' positions and mask."""
    from PIL import Image
    import qwen3_kind_models
    import test_export_hf_vision_language as qwen_tests

    vision_inputs, processor_class, resized = QWEN_FAMILIES[family]
    model = {"qwen2_5_vl": qwen_tests.save_qwen2_5_vl, "qwen2_vl": save_qwen2_vl}[family](tmp_path / "source")
    out = tmp_path / "out"
    verification = export_hf(tmp_path / "source", out, runtime="standard", verify=True, tokens=8).verification
    assert verification.passed and verification.onnx_tokens == verification.torch_tokens  # the features merged as Transformers.js does
    inputs = {name: [i.name for i in graph.input] for name, graph in checked_graphs(out).items()}
    assert inputs["embed_tokens"] == ["input_ids"] and inputs["vision_encoder"] == vision_inputs
    assert inputs["decoder_model_merged"][:3] == ["inputs_embeds", "attention_mask", "position_ids"]
    assert not (out / "genai_config.json").exists()
    # Transformers.js's AutoProcessor builds the processor preprocessor_config.json names
    assert json.loads((out / "preprocessor_config.json").read_text())["processor_class"] == processor_class
    rng = np.random.default_rng(0)
    paths = []
    for height, width in ((56, 84), (45, 75), (130, 60)):  # the first: sides multiples of 28, not resized
        paths.append(tmp_path / f"{height}x{width}.png")
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(paths[-1])
    image_processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "source")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "source")
    # Transformers.js's own processor on the folder's chat template: the image it does not resize, one it resizes
    prompts = [{"messages": IMAGE_MESSAGES, "images": [str(path)]} for path in paths[:2]]
    chosen = [[paths[index] for index in indices] for indices in resized]
    for images_of_prompt in chosen:
        images = image_processor(images=[Image.open(path) for path in images_of_prompt], return_tensors="pt")
        text = qwen_tests.qwen_prompt(len(images_of_prompt))
        for grid in images["image_grid_thw"]:  # each placeholder expanded to its image's tokens, in order
            text = text.replace("<|image_pad|>", "<|placeholder|>" * (int(grid.prod()) // 4), 1)
        ids = tokenizer(text.replace("<|placeholder|>", "<|image_pad|>"), return_tensors="pt")["input_ids"]
        given = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": images["pixel_values"],
                 "image_grid_thw": images["image_grid_thw"]}
        prompts.append({"inputs": tensor_specs(given)})
    # a left-padded batch without images, and one of a tall and a wide image
    pad = int(model.config.text_config.pad_token_id)
    batches = [qwen3_kind_models.processed_batch(tmp_path / "source", family, batch, pad)
               for batch in ([([], "describe this image"), ([], "the lazy dog")],
                             [([paths[2]], "describe this image"), ([paths[1]], "describe this image")])]
    prompts += [{"inputs": tensor_specs(given)} for given in batches]
    job = {"folder": str(out), "task": "image-text-to-text",
           "image_text": {"prompts": prompts, "new_tokens": NEW_TOKENS}}
    results = run_in_transformers_js(transformers_js, tmp_path, job)["image_text"]
    template = tokenizer.apply_chat_template(IMAGE_MESSAGES, add_generation_prompt=True, tokenize=False)
    differences = []
    for path, result in zip(paths, results[:2]):  # the chat template's prompt, ids and grid transformers'
        assert result["prompt"] == template == qwen_tests.qwen_prompt(1)
        client = client_tensors(result["processed"])
        differences.append(pixel_difference(client, qwen3_kind_models.processed_batch(
            tmp_path / "source", family, [([path], "describe this image")], pad)))
        assert result["generated"] == qwen_generated(model, client)  # transformers' tokens on those inputs
    assert differences[0] <= 1e-5 < differences[1]  # sharp's bicubic resize is not PIL's
    expected_tokens = [qwen_tests.transformers_tokens(tmp_path / "source", model, images_of_prompt, NEW_TOKENS)
                       for images_of_prompt in [[paths[0]], *chosen]]
    generated = [result["generated"] for result in results[:1] + results[2:2 + len(chosen)]]
    assert generated == expected_tokens and expected_tokens[0] != expected_tokens[-1]
    # the padded batches: Transformers.js's first token transformers' (QWEN_GENERATION in transformers_js.py says why
    # no more), the folder's 16 tokens in onnxruntime on transformers' positions and mask
    for given, result in zip(batches, results[-2:]):
        assert 0 in given["attention_mask"]
        with torch.no_grad():
            tokens = model.generate(**given, mm_token_type_ids=(given["input_ids"] == model.config.image_token_id).long(),
                                    max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=pad)
        expected = tokens[:, given["input_ids"].shape[1]:].tolist()
        assert [row[:1] for row in result["generated_rows"]] == [row[:1] for row in expected]
        assert folder_argmax(out, model, given, expected) == expected


# (height, width) of the images of the Qwen3-VL kind's prompts: neither side a multiple of the merged patch (32
# pixels), a wide and a tall one, other grids than the export's example (3 x 5 and 2 x 2 merged tokens)
QWEN3_KIND_IMAGES = ((45, 75), (130, 60))


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_vl_moe", "glm_ocr", "qwen3_5", "qwen3_5_moe"])
def test_qwen3_kind_folders_in_transformers_js(tmp_path, transformers_js, family):
    """Qwen3-VL and its kin as `--runtime standard` writes them for Transformers.js: rows
    wider than the embeddings where DeepStack features ride beside them (embed_tokens' zeros
    at text tokens, which Transformers.js's merge overwrites whole at image tokens). 16 greedy
    tokens equal transformers' on an image of another grid than the export's, on a
    left-padded batch of a tall and a wide image (mRoPE positions past the padding), and on
    a prompt without an image; the folder checked in onnxruntime by export-hf's verification. Through
    Transformers.js's own processor on the folder's chat template: an image of whole merged patches
    (transformers' ids, grid and pixels) and a resized one (transformers' ids and grid, sharp's
    pixels), each giving the tokens transformers generates from the inputs it gave."""
    from PIL import Image
    import qwen3_kind_models

    model = qwen3_kind_models.SAVERS[family](tmp_path / "source")
    config = model.config
    out = tmp_path / "out"
    verification = export_hf(tmp_path / "source", out, runtime="standard", verify=True, tokens=8).verification
    assert verification.passed and verification.onnx_tokens == verification.torch_tokens
    hidden = config.text_config.hidden_size
    deepstack = len(getattr(config.vision_config, "deepstack_visual_indexes", None) or [])
    widths = {name: {value.name: value.type.tensor_type.shape.dim[-1].dim_value for value in [*graph.input, *graph.output]}
              for name, graph in checked_graphs(out).items()}
    # the embeddings and each DeepStack block side by side, in all three models
    assert widths["embed_tokens"]["inputs_embeds"] == widths["decoder_model_merged"]["inputs_embeds"] == hidden * (1 + deepstack)
    assert widths["vision_encoder"]["image_features"] == hidden * (1 + deepstack)
    assert json.loads((out / "config.json").read_text())["model_type"] == family
    rng = np.random.default_rng(0)
    paths = []
    for height, width in QWEN3_KIND_IMAGES:
        paths.append(tmp_path / f"{height}x{width}.png")
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(paths[-1])
    pad = int(config.text_config.pad_token_id)
    question = "describe this image"
    # a wide image; a tall one; a left-padded batch without images; a left-padded batch of a wide and a tall image
    batches = [[([paths[0]], question)], [([paths[1]], question)], [([], question), ([], "the lazy dog")],
               [([paths[1]], question), ([paths[0]], question)]]
    prompts, expected = [], []
    for batch in batches:
        given = qwen3_kind_models.processed_batch(tmp_path / "source", family, batch, pad)
        prompts.append({"inputs": tensor_specs(given)})
        extra = {"mm_token_type_ids": (given["input_ids"] == config.image_token_id).long()} if "pixel_values" in given else {}
        with torch.no_grad():
            tokens = model.generate(**given, **extra, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                    pad_token_id=pad)
        expected.append(tokens[:, given["input_ids"].shape[1]:].tolist())
    assert all(0 in prompts[index]["inputs"]["attention_mask"]["data"] for index in (2, 3))  # the batches are padded
    # Transformers.js's own processor (the folder's processor_class) on the folder's chat template: an image of whole
    # merged patches, which it does not resize, and the wide one, which it resizes with sharp (other pixels)
    side = config.vision_config.patch_size * config.vision_config.spatial_merge_size
    whole = tmp_path / "whole.png"
    Image.fromarray(rng.integers(0, 256, (2 * side, 3 * side, 3), dtype=np.uint8)).save(whole)
    prompts += [{"messages": IMAGE_MESSAGES, "images": [str(path)]} for path in (whole, paths[0])]
    job = {"folder": str(out), "task": "image-text-to-text", "image_text": {"prompts": prompts, "new_tokens": NEW_TOKENS}}
    outcome = run_in_transformers_js(transformers_js, tmp_path, job)["image_text"]
    results = [result["generated_rows"] for result in outcome[:4]]
    assert results[:2] == expected[:2] and expected[0] != expected[1]  # the images changed the tokens
    template = transformers.AutoTokenizer.from_pretrained(tmp_path / "source").apply_chat_template(
        IMAGE_MESSAGES, add_generation_prompt=True, tokenize=False)
    differences = []
    for path, result in zip((whole, paths[0]), outcome[4:]):
        assert result["prompt"] == template
        client = client_tensors(result["processed"])
        differences.append(pixel_difference(client, qwen3_kind_models.processed_batch(tmp_path / "source", family,
                                                                                       [([path], question)], pad)))
        # transformers' tokens on the inputs Transformers.js's processor gave
        assert result["generated"] == qwen_generated(model, client)
    assert differences[0] <= 1e-5 < differences[1]
    # the prompt step alone is transformers' without images or with padding: after it, Transformers.js 4.3.2 (as
    # 4.3.1) feeds a prompt without images the positions of its text-only mRoPE deltas, `max + 1n + BigInt(dims[1])` where
    # transformers' is max + 1 - length (Qwen2VLForConditionalGeneration._get_text_only_rope_index), and unmasks a
    # batch's padding (prepare_inputs_for_generation sets `pixel_values` to null, not undefined, so
    # generic_text_to_text_forward gives a one-token step ones over the past as its mask)
    assert [[row[:1] for row in result] for result in results[2:]] == [[row[:1] for row in rows] for rows in expected[2:]]
    # the folder's models on transformers' positions and mask: the padded batch's tokens in onnxruntime
    assert folder_argmax(out, model, qwen3_kind_models.processed_batch(tmp_path / "source", family, batches[3], pad),
                         expected[3]) == expected[3]


def qwen_generated(model, given: dict[str, torch.Tensor]) -> list[int]:
    """transformers' 16 greedy tokens of a Qwen-VL kind on ``given`` (one prompt's processed inputs)."""
    image = (given["input_ids"] == model.config.image_token_id).long()
    inputs = {name: given[name] for name in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw")}
    with torch.no_grad():
        tokens = model.generate(**inputs, mm_token_type_ids=image, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                do_sample=False)
    return tokens[0, given["input_ids"].shape[1]:].tolist()


def folder_argmax(out, model, given: dict, tokens: list[list[int]]) -> list[list[int]]:
    """The greedy picks of the folder's three models in onnxruntime after each of ``given``'s
    rows followed by its ``tokens`` (one run over the whole sequence, from an empty cache), fed
    transformers' mRoPE positions and the padding mask, the features merged as Transformers.js
    does; never the end of text, as in transformers' generation of ``tokens``."""
    from fx2onnx.hub.shared.verification import empty_cache, end_tokens, run_session
    from fx2onnx.hub.vision_language.folder_verification import merged_features
    import onnxruntime

    image = int(model.config.image_token_id)
    ids = torch.cat([given["input_ids"], torch.tensor(tokens)], dim=1)
    mask = torch.cat([given["attention_mask"], torch.ones_like(torch.tensor(tokens))], dim=1)
    positions, _ = model.model.get_rope_index(ids, (ids == image).long(), image_grid_thw=given.get("image_grid_thw"),
                                              attention_mask=mask)
    sessions = {name: onnxruntime.InferenceSession(os.fspath(out / "onnx" / f"{name}.onnx"))
                for name in ("vision_encoder", "embed_tokens", "decoder_model_merged")}
    embeds = run_session(sessions["embed_tokens"], {"input_ids": ids.numpy()})["inputs_embeds"]
    if "pixel_values" in given:  # the grid under the vision model's name for it (Qwen2-VL's `grid_thw`)
        pixels, grid = (value.name for value in sessions["vision_encoder"].get_inputs())
        features = run_session(sessions["vision_encoder"], {pixels: given["pixel_values"].numpy(),
                                                            grid: given["image_grid_thw"].numpy()})["image_features"]
        embeds = merged_features(ids.numpy(), embeds, features, image)
    decoder = sessions["decoder_model_merged"]
    feed = {"inputs_embeds": embeds, "attention_mask": mask.numpy(), "position_ids": positions.numpy(),
            **empty_cache(decoder, batch=ids.shape[0])}
    logits = run_session(decoder, feed)["logits"]
    logits[..., end_tokens(model)] = -np.inf  # as transformers' min_new_tokens keeps it generating
    prompt = given["input_ids"].shape[1]
    return logits[:, prompt - 1:-1].argmax(-1).tolist()


def save_llava(folder, strategy: str = "default"):
    """A two-layer LLaVA (a two-layer CLIP tower of 42-pixel images, 9 image tokens each, the
    "default" ``strategy`` dropping the class token, "full" keeping it: 10) with a tokenizer that
    has an `<image>` token."""
    tokenizer = trained_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    text = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config = transformers.LlavaConfig(
        text_config=transformers.LlamaConfig(**text),
        vision_config=transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                    num_attention_heads=2, image_size=42, patch_size=14),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"), vision_feature_layer=-2,
        vision_feature_select_strategy=strategy, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.LlavaForConditionalGeneration(config).eval()
    model.save_pretrained(folder)
    image_processor = transformers.CLIPImageProcessor(size={"shortest_edge": 42}, crop_size={"height": 42, "width": 42})
    image_processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # its processor as released checkpoints save it (processor_config.json: the class token among the image tokens, which
    # the "default" strategy then subtracts)
    transformers.LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=14, image_token="<image>",
                                num_additional_image_tokens=1, vision_feature_select_strategy=strategy).save_pretrained(folder)
    return model, image_processor


def test_llava_folder_in_transformers_js(tmp_path, transformers_js):
    """LLaVA as `--runtime standard` writes it for Transformers.js (a vision_encoder of any
    number of images, features merged by Transformers.js, 1-D positions): 16 greedy tokens
    equal transformers' on transformers' processed inputs, one image alone and two in one prompt;
    the folder written in fake mode. Transformers.js's own LlavaProcessor, were the folder to name
    it, counts one image token more than the features (the client's: the folder names none)."""
    from PIL import Image

    model, image_processor = save_llava(tmp_path / "source")
    out = tmp_path / "out"
    # in fake mode: the vision tower's last layer, computed but never read (features of layer -2), is dropped with its
    # weights by the optimizer while the weights are hidden
    verification = export_hf(tmp_path / "source", out, runtime="standard", verify=True, tokens=4, fake=True).verification
    assert verification.passed and verification.onnx_tokens == verification.torch_tokens
    checked_graphs(out)
    rng = np.random.default_rng(0)
    opened = [Image.fromarray(rng.integers(0, 256, size, dtype=np.uint8)) for size in ((50, 70, 3), (42, 42, 3))]
    image_id = model.config.image_token_id
    prompts, expected = [], []
    for chosen in (opened[:1], opened):
        pixels = image_processor(images=chosen, return_tensors="pt")["pixel_values"]
        ids = torch.tensor([[1, 40, 41] + ([image_id] * 9 + [42]) * len(chosen) + [43, 44, 45]])
        given = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels}
        prompts.append({"inputs": tensor_specs(given)})
        with torch.no_grad():
            generated = model.generate(**given, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
        expected.append(generated[0, ids.shape[1]:].tolist())
    job = {"folder": str(out), "task": "image-text-to-text", "image_text": {"prompts": prompts, "new_tokens": NEW_TOKENS}}
    results = run_in_transformers_js(transformers_js, tmp_path, job)["image_text"]
    assert [result["generated"] for result in results] == expected and expected[0] != expected[1]
    # why the folder names no processor class: Transformers.js's LlavaProcessor on the released processor_config.json the
    # folder keeps counts 9 + 1 image tokens (src/models/llava/processing_llava.js:21-23; transformers' 9), and its
    # merge refuses them
    settings = json.loads((out / "preprocessor_config.json").read_text())
    assert "processor_class" not in settings and (out / "processor_config.json").is_file()
    (out / "preprocessor_config.json").write_text(json.dumps({**settings, "processor_class": "LlavaProcessor"}))
    path = tmp_path / "42x42.png"
    opened[1].save(path)
    prompt = {"text": "<image>describe this image", "images": [str(path)]}
    done = node_run(transformers_js, tmp_path, {**job, "image_text": {"prompts": [prompt], "new_tokens": NEW_TOKENS}})
    error = "Number of tokens and features do not match: tokens: 10, features 9"
    assert done.returncode != 0 and error in done.stderr, done.stderr[-3000:]


def test_llava_full_strategy_folder_names_its_processor(tmp_path, transformers_js):
    """LLaVA under the "full" strategy (the class token kept: 10 features a 42-pixel image), whose
    image tokens Transformers.js's LlavaProcessor counts as transformers' does: the folder names
    LlavaProcessor, and on an image it does not resize (42x42) and one it resizes (50x70) its ids
    and mask equal transformers' processor's, the pixels within 1e-5 on the first, and
    Transformers.js's 16 greedy tokens equal transformers' on the inputs its processor gave."""
    model, _ = save_llava(tmp_path / "source", strategy="full")
    out = tmp_path / "out"
    verification = export_hf(tmp_path / "source", out, runtime="standard", verify=True, tokens=4).verification
    assert verification.passed and verification.onnx_tokens == verification.torch_tokens
    checked_graphs(out)
    assert json.loads((out / "preprocessor_config.json").read_text())["processor_class"] == "LlavaProcessor"
    paths = []
    for seed, (height, width) in enumerate(((42, 42), (50, 70))):
        paths.append(tmp_path / f"{height}x{width}.png")
        random_image(height, width, seed).save(paths[-1])
    prompt = {"text": "<image>describe this image"}
    job = {"folder": str(out), "task": "image-text-to-text",
           "image_text": {"prompts": [{**prompt, "images": [str(path)]} for path in paths], "new_tokens": NEW_TOKENS}}
    results = run_in_transformers_js(transformers_js, tmp_path, job)["image_text"]
    image_id = model.config.image_token_id
    assert [result["processed"]["input_ids"]["data"].count(image_id) for result in results] == [10, 10]
    differences = assert_client_processor(model, transformers.AutoProcessor.from_pretrained(tmp_path / "source"),
                                          results, paths, prompt)
    assert differences[0] <= 1e-5 < differences[1]
    assert results[0]["generated"] != results[1]["generated"]


def save_idefics3(folder, family: str):
    """A two-layer Idefics3 or SmolVLM (``family``; a two-layer vision tower of 56-pixel crops,
    4 image tokens each after the pixel shuffle) with a tokenizer that has Idefics3's image
    tokens, and an image processor that cuts an image into up to 2 x 2 crops and the whole image."""
    tokenizer = trained_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<fake_token_around_image>", "<image>", "<end_of_utterance>",
                                                                "<global-img>"]})
    text = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config_class, model_class, processor_class = {
        "idefics3": (transformers.Idefics3Config, transformers.Idefics3ForConditionalGeneration, transformers.Idefics3ImageProcessorPil),
        "smolvlm": (transformers.SmolVLMConfig, transformers.SmolVLMForConditionalGeneration, transformers.SmolVLMImageProcessorPil),
    }[family]
    config = config_class(
        text_config=text, vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                             image_size=56, patch_size=14),
        scale_factor=2, image_token_id=tokenizer.convert_tokens_to_ids("<image>"), pad_token_id=0)
    torch.manual_seed(0)
    model = model_class(config).eval()
    model.save_pretrained(folder)
    image_processor = processor_class(size={"longest_edge": 112}, max_image_size={"longest_edge": 56})
    image_processor.save_pretrained(folder)
    tokenizer.chat_template = IDEFICS3_TEMPLATE
    tokenizer.save_pretrained(folder)  # no processor_config.json: export-hf writes image_seq_len
    return model, transformers.Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4,
                                                 chat_template=IDEFICS3_TEMPLATE)


@pytest.mark.parametrize("family", ["idefics3", "smolvlm"])
def test_idefics3_folder_in_transformers_js(tmp_path, transformers_js, family):
    """Idefics3 and SmolVLM as `--runtime standard` writes them for Transformers.js (a
    vision_encoder over a prompt's crops and their bool pixel_attention_mask, 1-D positions):
    16 greedy tokens equal transformers' on its processor's inputs, an image cut into 2 x 2
    crops and the whole, and with another cut into 2 x 1 in one prompt; Idefics3's folder
    written in fake mode. Through Transformers.js's own processor (the folder's processor_class,
    and image_seq_len in the processor_config.json export-hf writes) on the folder's chat
    template: transformers' ids and crop masks for an image of the processor's longest edge
    (its crops not resized: transformers' pixels; the whole scaled down by sharp: other pixels)
    and one it resizes, each giving the tokens transformers generates from those inputs."""
    from PIL import Image

    model, processor = save_idefics3(tmp_path / "source", family)
    out = tmp_path / "out"
    # Idefics3's in fake mode: each part reads its weights from the checkpoint by their names (`model.text_model.*`)
    verification = export_hf(tmp_path / "source", out, runtime="standard", verify=True, tokens=4,
                             fake=family == "idefics3").verification
    assert verification.passed and verification.onnx_tokens == verification.torch_tokens
    checked_graphs(out)
    assert json.loads((out / "processor_config.json").read_text()) == {"image_seq_len": processor.image_seq_len}
    rng = np.random.default_rng(0)
    opened = [Image.fromarray(rng.integers(0, 256, size, dtype=np.uint8)) for size in ((50, 90, 3), (100, 40, 3))]
    prompts, expected, crops = [], [], []
    for text, chosen in (("<image>the quick brown fox", opened[:1]), ("<image>the lazy dog<image>jumps", opened)):
        given = dict(processor(text=text, images=[chosen], return_tensors="pt"))
        crops.append(given["pixel_values"].shape[1])
        with torch.no_grad():
            generated = model.generate(**given, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
        expected.append(generated[0, given["input_ids"].shape[1]:].tolist())
        given["pixel_attention_mask"] = given["pixel_attention_mask"].bool()  # as Transformers.js's processor gives it
        prompts.append({"inputs": tensor_specs(given)})
    assert crops == [4 + 1, 4 + 1 + 2 + 1]  # each image cut into 2 x 2 or 2 x 1 crops, beside the whole
    paths = [tmp_path / "112x112.png", tmp_path / "50x90.png"]  # the processor's longest edge; one it resizes
    Image.fromarray(rng.integers(0, 256, (112, 112, 3), dtype=np.uint8)).save(paths[0])
    opened[0].save(paths[1])
    prompts += [{"messages": IMAGE_MESSAGES, "images": [str(path)]} for path in paths]
    job = {"folder": str(out), "task": "image-text-to-text", "image_text": {"prompts": prompts, "new_tokens": NEW_TOKENS}}
    results = run_in_transformers_js(transformers_js, tmp_path, job)["image_text"]
    assert [result["generated"] for result in results[:2]] == expected and expected[0] != expected[1]
    compared = ("input_ids", "attention_mask", "pixel_values", "pixel_attention_mask")
    differences = assert_client_processor(model, processor, results[2:], paths, {"messages": IMAGE_MESSAGES}, compared)
    # the 112-pixel image's four crops are its pixels as they are; its whole, scaled to 56 pixels, sharp's Lanczos
    text = processor.apply_chat_template(IMAGE_MESSAGES, add_generation_prompt=True, tokenize=False)
    pixels = client_tensors(results[2]["processed"])["pixel_values"]
    crop_differences = (pixels - processor(text=text, images=[Image.open(paths[0])], return_tensors="pt")["pixel_values"]).abs()
    assert crop_differences[0, :4].max() <= 1e-5 < crop_differences[0, 4].max() and differences[1] > 1e-5


class PixtralRows:
    """transformers' PixtralProcessor (which needs torchvision, not installed here) as its
    `replace_image_token` expands a prompt's image: a row of [IMG] per merged patch row, each
    but the last followed by [IMG_BREAK], the last by [IMG_END] (the image processor given the
    merged patch, 28 pixels, as PixtralProcessor gives it)."""

    def __init__(self, image_processor, tokenizer) -> None:
        self.image_processor, self.tokenizer = image_processor, tokenizer

    def apply_chat_template(self, messages: list, **options) -> str:
        return self.tokenizer.apply_chat_template(messages, **options)

    def __call__(self, text: str, images: list, return_tensors: str) -> dict[str, torch.Tensor]:
        processed = self.image_processor(images=images, patch_size={"height": 28, "width": 28}, return_tensors=return_tensors)
        height, width = processed["image_sizes"][0].tolist()
        rows = ["[IMG]" * (width // 28) + "[IMG_BREAK]"] * (height // 28)
        tokens = "".join(rows)[:-len("[IMG_BREAK]")] + "[IMG_END]"
        return {**self.tokenizer(text.replace("[IMG]", tokens, 1), return_tensors=return_tensors), **processed}


def test_mistral3_folder_in_transformers_js(tmp_path, transformers_js):
    """Mistral 3 as `--runtime standard` writes it for Transformers.js (its Llava path: the
    vision model on `pixel_values`, 1-D positions from the mask): 16 greedy tokens equal
    transformers' on transformers' processed inputs, for two images of other sizes; through
    Transformers.js's own PixtralProcessor (the processor_config.json entries and image patch
    export-hf writes, the source having no processor saved) on the folder's chat template,
    transformers' PixtralProcessor's ids (PixtralRows) for an image of whole merged patches
    (transformers' pixels) and one it resizes (sharp's pixels), each giving the tokens
    transformers generates from those inputs."""
    from PIL import Image
    from test_export_hf_mistral3 import IMAGE_SIZES, prompt, save_mistral3, transformers_tokens

    model, (image_processor, tokenizer) = save_mistral3(tmp_path / "source")
    tokenizer.chat_template = PIXTRAL_TEMPLATE
    tokenizer.save_pretrained(tmp_path / "source")
    out = tmp_path / "out"
    export_hf(tmp_path / "source", out, runtime="standard")
    checked_graphs(out)
    rng = np.random.default_rng(0)
    paths, prompts = [], []
    for height, width in IMAGE_SIZES[:2]:
        paths.append(tmp_path / f"{height}x{width}.png")
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(paths[-1])
        images = image_processor(images=[Image.open(paths[-1])], return_tensors="pt")
        rows = ["[IMG]" * (width // 28) + "[IMG_BREAK]"] * (height // 28)  # as PixtralProcessor expands [IMG]
        ids = tokenizer(prompt(1).replace("[IMG]", "".join(rows)[:-len("[IMG_BREAK]")] + "[IMG_END]"), return_tensors="pt")["input_ids"]
        prompts.append({"inputs": tensor_specs({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                                "pixel_values": images["pixel_values"]})})
    client_paths = [paths[0], tmp_path / "45x75.png"]  # whole merged patches; one it resizes
    random_image(45, 75, 0).save(client_paths[1])
    prompts += [{"messages": IMAGE_MESSAGES, "images": [str(path)]} for path in client_paths]
    job = {"folder": str(out), "task": "image-text-to-text", "image_text": {"prompts": prompts, "new_tokens": NEW_TOKENS}}
    results = run_in_transformers_js(transformers_js, tmp_path, job)["image_text"]
    expected = [transformers_tokens(model, (image_processor, tokenizer), [path], NEW_TOKENS) for path in paths]
    assert [result["generated"] for result in results[:2]] == expected and expected[0] != expected[1]
    differences = assert_client_processor(model, PixtralRows(image_processor, tokenizer), results[2:], client_paths,
                                          {"messages": IMAGE_MESSAGES})
    assert differences[0] <= 1e-5 < differences[1]


def spread_weights(model: torch.nn.Module) -> None:
    """Every matrix of ``model`` drawn again with a standard deviation of 0.3."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, 0.3)


def save_lighton_ocr(folder):
    """A two-layer LightOnOCR (two Pixtral vision layers, a Qwen3 text model) with Mistral 3's
    tokenizer (its image tokens named, as LightOnOcrProcessor reads them) and image processor
    (28-pixel merged patches), saved as its processor with a chat template."""
    from test_export_hf_mistral3 import LONGEST_EDGE, pixtral_parts

    tokenizer, entries = pixtral_parts("qwen3")
    config = transformers.LightOnOcrConfig(**entries)
    torch.manual_seed(0)
    model = transformers.LightOnOcrForConditionalGeneration(config).eval()
    spread_weights(model)  # the tokens then depend on the image (at the default init they do not)
    model.save_pretrained(folder)
    image_processor = transformers.PixtralImageProcessorPil(patch_size={"height": 28, "width": 28},
                                                            size={"longest_edge": LONGEST_EDGE})
    image_processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, extra_special_tokens={
        "image_token": "[IMG]", "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"})
    transformers.LightOnOcrProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=14, spatial_merge_size=2,
                                     chat_template=PIXTRAL_TEMPLATE).save_pretrained(folder)
    return model


def random_image(height: int, width: int, seed: int):
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def generated_by_transformers(model, given: dict) -> list:
    """transformers' greedy tokens after the prompt: a list, or a list per row of a batch."""
    with torch.no_grad():
        out = model.generate(**given, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    rows = out[:, given["input_ids"].shape[1]:].tolist()
    return rows[0] if len(rows) == 1 else rows


def lighton_ocr_prompts(source, model):
    """One image per prompt, two sizes and aspect ratios, each image's tokens as LightOnOcrProcessor
    writes them (one per merged patch, no breaks): Transformers.js's inputs and transformers' tokens."""
    from test_export_hf_mistral3 import IMAGE_SIZES

    image_processor = transformers.AutoImageProcessor.from_pretrained(source)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    prompts, expected = [], []
    for seed, (height, width) in enumerate(IMAGE_SIZES[:2]):
        images = image_processor(images=[random_image(height, width, seed)], return_tensors="pt")
        ids = tokenizer("[INST]" + "[IMG]" * ((height // 28) * (width // 28)) + "describe this image[/INST]",
                        return_tensors="pt")["input_ids"]
        given = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": images["pixel_values"]}
        prompts.append({"inputs": tensor_specs(given)})
        expected.append(generated_by_transformers(model, {**given, "image_sizes": images["image_sizes"]}))
    return prompts, expected


def two_way_prompts(source, model, text: list, images: list, causal_type: int) -> tuple[list, list]:
    """The folder's processor's inputs for each prompt (a list of texts: a left-padded batch),
    transformers given its `token_type_ids`, Transformers.js the ids, mask and pixels alone;
    the last prompt a padded batch, and the first two's tokens changed with `token_type_ids` all
    ``causal_type`` (causal attention throughout): the folder's two-way attention counts."""
    processor = transformers.AutoProcessor.from_pretrained(source)
    prompts, expected, processed = [], [], []
    for prompt_text, prompt_images in zip(text, images):
        given = processor(text=prompt_text, images=prompt_images, padding=True, padding_side="left", return_tensors="pt")
        given = {k: given[k] for k in ("input_ids", "attention_mask", "pixel_values", "token_type_ids")}
        expected.append(generated_by_transformers(model, given))
        prompts.append({"inputs": tensor_specs({k: given[k] for k in ("input_ids", "attention_mask", "pixel_values")})})
        processed.append(given)
    assert processed[-1]["attention_mask"][1, 0] == 0  # the batch is padded
    causal = [{**given, "token_type_ids": torch.full_like(given["token_type_ids"], causal_type)} for given in processed[:2]]
    assert [generated_by_transformers(model, given) for given in causal] != expected[:2]
    return prompts, expected


def gemma3_prompts(source, model):
    """One image, two images in one prompt (two blocks of two-way attention), and a left-padded
    batch of two prompts of one image each, of the processor's size."""
    from test_export_hf_vision_language import gemma_prompt

    text = [gemma_prompt(1), gemma_prompt(2), [gemma_prompt(1), gemma_prompt(1).replace("describe this image", "dog")]]
    images = [[random_image(64, 64, 0)], [random_image(64, 64, 1), random_image(64, 64, 2)],
              [[random_image(64, 64, 3)], [random_image(64, 64, 4)]]]
    return two_way_prompts(source, model, text, images, causal_type=0)  # 0: text, attending causally


# Gemma 3's chat template (its turns, an image as its start token, which the processor expands)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ 'model' if message['role'] == 'assistant' else "
    "message['role'] }}\n{% for part in message['content'] %}{% if part['type'] == 'image' %}<start_of_image>{% else %}"
    "{{ part['text'] }}{% endif %}{% endfor %}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}"
    "<start_of_turn>model\n{% endif %}"
)


def save_gemma3(folder):
    """The Gemma 3 tests' model (test_export_hf_vision_language.py) with a chat template, which
    Transformers.js's Gemma3Processor reads (chat_template.jinja) to load at all."""
    from test_export_hf_vision_language import save_gemma3 as save

    model = save(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = GEMMA_TEMPLATE
    tokenizer.save_pretrained(folder)
    return model


def save_paligemma(folder):
    """A two-layer PaliGemma (a two-layer SigLIP tower of 32-pixel images, 16 image tokens each)
    with its processor."""
    tokenizer = trained_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    text = dict(model_type="gemma", vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256, pad_token_id=0,
                bos_token_id=1, eos_token_id=2)
    vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, image_size=32, patch_size=8, projection_dim=64)
    config = transformers.PaliGemmaConfig(text_config=text, vision_config=vision, projection_dim=64, pad_token_id=0,
                                          image_token_index=tokenizer.convert_tokens_to_ids("<image>"))
    torch.manual_seed(0)
    model = transformers.PaliGemmaForConditionalGeneration(config).eval()
    spread_weights(model)  # the tokens then depend on the image and the prefix's two-way attention
    model.save_pretrained(folder)
    image_processor = transformers.SiglipImageProcessorPil(size={"height": 32, "width": 32})
    image_processor.image_seq_length = 16
    transformers.PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    return model


def paligemma_prompts(source, model):
    """One image, two in one prompt, and a left-padded batch of two prompts of one image each, of
    other sizes than the tower's; no suffix: every token of a prompt is the prefix (token_type_ids 0)."""
    text = ["<image>the quick brown fox", "<image><image>hello world", ["<image>the lazy dog jumps over", "<image>onnx"]]
    images = [[random_image(50, 70, 0)], [[random_image(32, 32, 1), random_image(40, 20, 2)]],
              [[random_image(32, 32, 3)], [random_image(60, 30, 4)]]]
    # 1: the suffix, attending causally (without token_type_ids transformers' Gemma attends both ways over an unpadded
    # prompt: PaliGemma's text config sets use_bidirectional_attention, and its mask is then skipped for sdpa's)
    return two_way_prompts(source, model, text, images, causal_type=1)


# the LLaVA-kind architectures Transformers.js runs through its LlavaForConditionalGeneration: the tiny model's
# maker, and the prompts as Transformers.js is given them with transformers' greedy tokens for each
LLAVA_KIND = {
    "lighton_ocr": (save_lighton_ocr, lighton_ocr_prompts),
    "gemma3": (save_gemma3, gemma3_prompts),
    "paligemma": (save_paligemma, paligemma_prompts),
}


# the LLaVA-kind types run through Transformers.js's own processor too (the folder names its class): their images'
# (height, width), one not resized (Gemma 3's and PaliGemma's processor's one size, LightOnOCR's whole merged
# patches) and another it resizes with sharp; the prompt, chat messages through the folder's template or
# (PaliGemma's, which has none) a prefix
CLIENT_PROCESSED = {
    "lighton_ocr": (((56, 84), (45, 75)), {"messages": IMAGE_MESSAGES}),
    "gemma3": (((64, 64), (50, 70)), {"messages": IMAGE_MESSAGES}),
    "paligemma": (((32, 32), (50, 70)), {"text": "<image>describe this image"}),
}


def assert_client_processor(model, processor, results: list[dict], paths: list, prompt: dict,
                            compared: tuple[str, ...] = ("input_ids", "attention_mask", "pixel_values")) -> list[float]:
    """The folder's processor in Transformers.js against transformers' ``processor`` on
    ``prompt`` with each image of ``paths`` (``results``, in order): the chat template's
    prompt, and of the tensors ``compared`` the ids, mask (and any other but the pixels) equal,
    the pixels of the same shape; and Transformers.js's 16 tokens transformers' on those
    inputs (transformers given besides its processor's tensors the model takes and
    Transformers.js's does not: token_type_ids, image_sizes). Returns the pixels' largest
    differences, one per image."""
    from PIL import Image

    text = (processor.apply_chat_template(prompt["messages"], add_generation_prompt=True, tokenize=False)
            if "messages" in prompt else prompt["text"])
    differences = []
    for path, result in zip(paths, results):
        assert result["prompt"] == (text if "messages" in prompt else None)
        expected = processor(text=text, images=[Image.open(path)], return_tensors="pt")
        client = {name: value for name, value in client_tensors(result["processed"]).items() if name in compared}
        assert sorted(client) == sorted(compared)
        differences.append(pixel_difference(client, {name: expected[name] for name in client}))
        besides = {name: expected[name] for name in ("token_type_ids", "image_sizes") if name in expected}
        assert result["generated"] == generated_by_transformers(model, {**client, **besides})
    return differences


@pytest.mark.parametrize("family", list(LLAVA_KIND))
def test_llava_kind_folder_in_transformers_js(tmp_path, transformers_js, family):
    """LLaVA-kind architectures as `--runtime standard` writes them for Transformers.js (the vision
    model on what Transformers.js's LlavaForConditionalGeneration feeds it, features merged by
    Transformers.js, 1-D positions from the mask): export-hf's verification (the three models in
    onnxruntime) and 16 greedy tokens in Transformers.js equal transformers' on transformers'
    processed inputs: LightOnOCR's images of two sizes and aspect ratios; Gemma 3's (its image tokens
    attending each other both ways) and PaliGemma's (its prompt attending itself both ways) one image,
    two in a prompt, and a left-padded batch as far as Transformers.js keeps its padding (padded_batch_tokens);
    each also through Transformers.js's own processor (assert_client_processor; LightOnOCR's its PixtralProcessor
    on the processor_config.json entries export-hf adds to the source's): an image it does not resize
    (transformers' pixels) and one it resizes."""
    save, make_prompts = LLAVA_KIND[family]
    model = save(tmp_path / "source")
    out = tmp_path / "out"
    verification = export_hf(tmp_path / "source", out, runtime="standard", verify=True, tokens=4).verification
    assert verification.passed and verification.onnx_tokens == verification.torch_tokens
    checked_graphs(out)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == family and config["architectures"] == [type(model).__name__]
    prompts, expected = make_prompts(tmp_path / "source", model)
    sizes, client_prompt = CLIENT_PROCESSED.get(family, ((), None))
    paths = []
    for seed, (height, width) in enumerate(sizes):
        paths.append(tmp_path / f"{height}x{width}.png")
        random_image(height, width, 10 + seed).save(paths[-1])
    prompts += [{**client_prompt, "images": [str(path)]} for path in paths]
    job = {"folder": str(out), "task": "image-text-to-text", "image_text": {"prompts": prompts, "new_tokens": NEW_TOKENS}}
    results = run_in_transformers_js(transformers_js, tmp_path, job)["image_text"]
    if paths:  # Transformers.js's own processor: the last prompts; the first image not resized (transformers' pixels)
        differences = assert_client_processor(model, transformers.AutoProcessor.from_pretrained(tmp_path / "source"),
                                              results[len(expected):], paths, client_prompt)
        assert differences[0] <= 1e-5 < differences[1]
    results = results[:len(expected)]
    generated = [result["generated"] if len(result["generated_rows"]) == 1 else result["generated_rows"] for result in results]
    assert generated[:2] == expected[:2] and expected[0] != expected[1]
    if len(expected) > 2:  # the left-padded batch: see padded_batch_tokens
        assert padded_batch_tokens(generated[2]) == padded_batch_tokens(expected[2])


def padded_batch_tokens(rows: list[list[int]]) -> tuple[list[int], list[int]]:
    """What Transformers.js 4.3 can give of a left-padded batch (the first row unpadded, the
    second padded): the first row's tokens and the second's first. After the prompt's step its
    image-text-to-text models replace the mask of the past by ones whenever pixel_values are among
    the inputs (`generic_text_to_text_forward`: `attention_mask = cat([ones([batch, past_length]),
    ...])`), so a padded row then attends its padding and takes positions counting it."""
    return rows[0], rows[1][:1]


def test_exaone_folder_names_its_layer_count_as_transformers_js_reads_it(tmp_path, transformers_js):
    """Transformers.js reads EXAONE's layer count as `num_layers` (transformers 5 writes
    `num_hidden_layers`; without it Transformers.js feeds no cache): the folder's config.json
    has both, transformers reads it back as the same config, and Transformers.js generates
    transformers' greedy tokens, one prompt alone and a left-padded batch."""
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(
        "exaone", vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(tmp_path / "source")
    said = []
    export_hf(tmp_path / "source", tmp_path / "out", say=said.append)
    onnx.checker.check_model(os.fspath(tmp_path / "out" / "onnx" / "model.onnx"), full_check=True)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == "exaone" and written["num_layers"] == written["num_hidden_layers"] == 2
    assert transformers.AutoConfig.from_pretrained(tmp_path / "out").num_hidden_layers == 2
    assert not [line for line in said if "cannot load" in line]
    assert_generates_as_transformers(transformers_js, tmp_path, tmp_path / "out", model)


def assert_generates_as_transformers(prefix: Path, scratch: Path, folder: Path, model: torch.nn.Module) -> None:
    """Transformers.js's 16 greedy tokens from ``folder`` equal transformers' from ``model``
    (a vocabulary of 100 at least), for two prompts alone and as one left-padded batch."""
    prompts = [[5, 17, 42, 8], [9, 3, 77, 31, 60, 12, 4, 50, 21]]
    ids, mask = left_padded(prompts)
    result = run_in_transformers_js(prefix, scratch, {
        "folder": str(folder), "task": "text-generation", "prompts": prompts, "new_tokens": NEW_TOKENS,
        "batch": {"input_ids": ids, "attention_mask": mask}})
    assert result["generated"] == [greedy(model, torch.tensor([p]), torch.ones(1, len(p), dtype=torch.int64))[0] for p in prompts]
    assert result["batch_generated"] == greedy(model, torch.tensor(ids), torch.tensor(mask))


HYBRID_IDS = dict(vocab_size=100, pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=64)
# model type -> (its config; the inputs its states take in the folder). OLMo-hybrid's convolution fed as
# three inputs is checked against the exported graph in tests/unit/hub/test_state_names.py: a gated delta
# rule's export takes a minute.
HYBRID_CONFIGS = {
    # a short convolution's state alone: past_conv.<i>
    "lfm2": (lambda: transformers.Lfm2Config(
        **HYBRID_IDS, hidden_size=32, intermediate_size=64, block_ff_dim=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, conv_L_cache=3, layer_types=["conv", "full_attention"]), ["past_conv.0"]),
    # LFM3: its convolution's state beside a sliding-window attention layer of a window of 8, which each
    # prompt and its 16 new tokens pass (Transformers.js 4.3.2's class feeds both)
    "lfm3": (lambda: transformers.Lfm3Config(
        **HYBRID_IDS, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, conv_L_cache=3, sliding_window=8,
        layer_types=["conv", "sliding_attention", "full_attention"]), ["past_conv.0"]),
    # a mamba mixer's convolution and scan states, its layer kinds in config.json by their older names: past_conv, past_ssm
    "nemotron_h": (lambda: transformers.NemotronHConfig(
        **HYBRID_IDS, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        layers_block_type=["linear_attention", "full_attention", "mlp"], mamba_num_heads=4, mamba_head_dim=8,
        ssm_state_size=8, n_groups=1, chunk_size=16), ["past_conv.0", "past_ssm.0"]),  # each prompt in one chunk
}


@pytest.mark.parametrize("family", list(HYBRID_CONFIGS))
def test_hybrid_decoder_folders_in_transformers_js(tmp_path, family, transformers_js):
    """A hybrid decoder's states take the names Transformers.js feeds its model type (started as
    zeros of each input's own shape, each `present*` fed back as the next `past*`): 16 greedy
    tokens equal transformers', each prompt alone and as a left-padded batch; the folder passes
    its own verification in onnxruntime under the same names."""
    make_config, state_inputs = HYBRID_CONFIGS[family]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(make_config()).eval()
    model.save_pretrained(tmp_path / "source")
    said = []
    result = export_hf(tmp_path / "source", tmp_path / "out", say=said.append, verify=True, tokens=NEW_TOKENS)
    assert result.verification.passed and result.verification.tokens_equal
    assert not [line for line in said if "cannot load" in line]
    path = os.fspath(tmp_path / "out" / "onnx" / "model.onnx")
    onnx.checker.check_model(onnx.load(path), full_check=True)
    inputs = [i.name for i in onnx.load(path, load_external_data=False).graph.input]
    assert inputs[3:3 + len(state_inputs)] == state_inputs and "past_key_values.1.key" in inputs
    assert not [name for name in inputs if "_states." in name]
    # config.json as written (Nemotron-H's layer kinds by their older names) reads back as the model's config
    assert transformers.AutoConfig.from_pretrained(tmp_path / "out").layer_types == model.config.layer_types
    assert_generates_as_transformers(transformers_js, tmp_path, tmp_path / "out", model)


# model type -> (its config; what its folder's graph takes in Transformers.js's form)
FED_AS_TRANSFORMERS_JS_FEEDS = {
    # positions counted from the mask in the graph: no position_ids input, which its Qwen-VL class
    # would fill with positions of its own (the layers' kind is beside the point: full attention, fast)
    "qwen3_5_text": (lambda: transformers.AutoConfig.for_model(
        "qwen3_5_text", **HYBRID_IDS, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, layer_types=["full_attention", "full_attention"]),
        lambda inputs: "position_ids" not in inputs),
    # the indexer keys as a last head of the key cache (latent keys 16 + 4 wide, indexer keys 8): an
    # indexer keeping 4 tokens, fewer than every prompt with its new tokens, so the kept keys matter;
    # 8 indexer heads, as 2 give several keys the same score (a ReLU's zeros) at the 4th place, where
    # torch's and onnxruntime's top-k pick different keys
    "glm_moe_dsa": (lambda: transformers.AutoConfig.for_model(
        "glm_moe_dsa", **HYBRID_IDS, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4,
        qk_nope_head_dim=8, v_head_dim=8, index_head_dim=8, index_n_heads=8, index_topk=4, n_routed_experts=4,
        num_experts_per_tok=2, n_group=1, topk_group=1),
        lambda inputs: inputs["past_key_values.0.key"][1] == inputs["past_key_values.0.value"][1] + 1
        and not [name for name in inputs if "indexer" in name]),
    # DeepSeek-V4 (export-hf's own step, its compressors' counts from the past length): a sliding layer, a
    # compressed sparse one (windows of 4, an indexer keeping 3 entries, fewer than the prompts reach) and a
    # heavily compressed one (windows of 8), which the prompts and their 16 new tokens pass; 16 indexer heads,
    # as 2 give several entries the same score (a ReLU's zeros) where torch's and onnxruntime's top-k differ
    "deepseek_v4": (lambda: transformers.DeepseekV4Config(
        **HYBRID_IDS, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        q_lora_rank=16, o_lora_rank=16, o_groups=2, index_n_heads=16, index_head_dim=8, index_topk=3,
        moe_intermediate_size=16, n_routed_experts=2, num_experts_per_tok=1, sliding_window=6,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
        mlp_layer_types=["hash_moe", "moe", "moe"], qk_rope_head_dim=2, partial_rotary_factor=0.25,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}),
        lambda inputs: "position_ids" not in inputs and inputs["past_key_values.1.value"][-1] == 8 + 8
        and inputs["past_indexer.1.kv"][-1] == 2 * 8 and not [n for n in inputs if n.startswith("past_indexer.2")]),
    # two layers' caches in the inputs of the first (cca_time1 2, transformers' default: Transformers.js
    # feeds layers 0, 2, 4, ...), joined along their heads and channels
    "zaya": (lambda: transformers.ZayaConfig(
        **HYBRID_IDS, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, head_dim=8, moe_intermediate_size=32,
        num_experts=4, layer_types=["hybrid", "hybrid"], cca_time1=2),
        lambda inputs: not [name for name in inputs if name.startswith("past_key_values.1.")]
        and inputs["past_key_values.0.key"][1] == 2 * 2),
}


@pytest.mark.parametrize("family", list(FED_AS_TRANSFORMERS_JS_FEEDS))
def test_folders_taking_what_transformers_js_feeds_their_model_type(tmp_path, family, transformers_js):
    """Qwen3.5's text model (whose Transformers.js class computes positions of its own when the
    graph takes them), GLM-MoE-DSA (whose indexer keys Transformers.js feeds no input for) and
    ZAYA (whose cache Transformers.js feeds every cca_time1-th layer only):
    16 greedy tokens equal transformers' in Transformers.js's onnxruntime-node, each prompt alone
    and as a left-padded batch (the graph rewrites themselves against the exported graphs in
    onnxruntime: tests/unit/hub/test_transformers_js_inputs.py)."""
    make_config, takes = FED_AS_TRANSFORMERS_JS_FEEDS[family]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(make_config()).eval()
    model.save_pretrained(tmp_path / "source")
    said = []
    export_hf(tmp_path / "source", tmp_path / "out", say=said.append)
    assert not [line for line in said if "cannot load" in line]
    path = os.fspath(tmp_path / "out" / "onnx" / "model.onnx")
    onnx.checker.check_model(onnx.load(path), full_check=True)
    graph = onnx.load(path, load_external_data=False).graph
    assert takes({i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input})
    genai = tmp_path / "out" / "genai_config.json"
    if genai.exists():  # ONNX Runtime GenAI is told the inputs of the graph as rewritten
        decoder = json.loads(genai.read_text())["model"]["decoder"]
        named = [decoder["inputs"][role] for role in ("input_ids", "attention_mask", "position_ids") if role in decoder["inputs"]]
        assert {*named, decoder["inputs"]["past_key_names"] % 0} <= {i.name for i in graph.input}
    assert_generates_as_transformers(transformers_js, tmp_path, tmp_path / "out", model)


def assert_generates_as_onnxruntime(prefix: Path, scratch: Path, folder: Path, decoder: str, embedding: str | None = None):
    """Transformers.js's 16 greedy tokens from ``folder`` (a quantized one: not transformers'
    tokens) equal onnxruntime's greedy loop on the folder's ``decoder`` file (its ids embedded by
    ``embedding`` first, where given), two prompts alone and as one left-padded batch."""
    from fx2onnx.hub.shared.verification import greedy_in_folder

    prompts = [[5, 17, 42, 8], [9, 3, 77, 31, 60, 12, 4, 50, 21]]
    ids, mask = left_padded(prompts)
    result = run_in_transformers_js(prefix, scratch, {
        "folder": str(folder), "task": "text-generation", "prompts": prompts, "new_tokens": NEW_TOKENS,
        "batch": {"input_ids": ids, "attention_mask": mask}})
    files = {"path": folder / "onnx" / decoder, "embedding": folder / "onnx" / embedding if embedding else None}
    # min_new_tokens: the end token (2) never chosen, in both
    alone = [greedy_in_folder(**files, prompts=[p], new_tokens=NEW_TOKENS, pad=0, banned=[2]).tokens[0] for p in prompts]
    assert result["generated"] == alone
    assert result["batch_generated"] == greedy_in_folder(**files, prompts=prompts, new_tokens=NEW_TOKENS, pad=0, banned=[2]).tokens
    assert len({t for tokens in alone for t in tokens}) > 1  # the prompts' tokens differ (ZAYA's repeat one each)


# model type -> the other modes its feed rewrite is run in: module functions (exact against transformers), and
# int4 with module functions (`model_q4.onnx`, against onnxruntime on that file); GLM-MoE-DSA's export with
# module functions and int4 together takes 40 s, its rewrite reads the same graph inputs either way
FED_IN_OTHER_MODES = {"qwen3_5_text": {"precision": "int4"}, "glm_moe_dsa": {}, "zaya": {"precision": "int4"}}


@pytest.mark.parametrize("family", list(FED_IN_OTHER_MODES))
def test_feed_rewrites_with_module_functions_and_int4_in_transformers_js(tmp_path, family, transformers_js):
    """The graph rewrites for Transformers.js's feeds (positions from the mask, indexer keys in
    the key cache, caches in groups) on a graph of module functions, and on an int4 one
    (`model_q4.onnx`): the graph takes what Transformers.js feeds, and Transformers.js's 16
    greedy tokens (alone and as a left-padded batch, past the indexer's 4 kept keys) are
    transformers' (float) or onnxruntime's on the same file (int4)."""
    make_config, takes = FED_AS_TRANSFORMERS_JS_FEEDS[family]
    precision = FED_IN_OTHER_MODES[family]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(make_config()).eval()
    model.save_pretrained(tmp_path / "source")
    said = []
    export_hf(tmp_path / "source", tmp_path / "out", module_functions=True, say=said.append, **precision)
    assert not [line for line in said if "cannot load" in line]
    name = "model_q4.onnx" if precision else "model.onnx"
    assert sorted(p.name for p in (tmp_path / "out" / "onnx").glob("*.onnx")) == [name]
    path = os.fspath(tmp_path / "out" / "onnx" / name)
    onnx.checker.check_model(onnx.load(path), full_check=True)
    graph = onnx.load(path, load_external_data=False)
    assert graph.functions and (not precision or [n for n in graph.graph.node if n.op_type == "MatMulNBits"]
                                or [n for f in graph.functions for n in f.node if n.op_type == "MatMulNBits"])
    assert takes(shapes(graph.graph.input))
    if precision:
        assert_generates_as_onnxruntime(transformers_js, tmp_path, tmp_path / "out", name)
    else:
        assert_generates_as_transformers(transformers_js, tmp_path, tmp_path / "out", model)


def audio_text_in_transformers_js(transformers_js, scratch: Path, model, out: Path, renamed: dict[str, str]) -> tuple[list, list]:
    """One clip's prompt (its audio tokens as many as the features' rows) through the folder
    ``out`` in Transformers.js (AutoModelForAudioTextToText, the audio inputs under the
    ``renamed`` names its class reads) and transformers' `generate`: both greedy tokens."""
    from fx2onnx.hub.audio_language.audio_inputs import audio_inputs
    from fx2onnx.hub.audio_language.hooks import audio_hooks
    from test_export_hf_audio_language import AUDIO_TOKEN

    hooks = audio_hooks(model)
    audio = audio_inputs(model, hooks, scratch / "source", batch=1, seed=3)
    with torch.no_grad():
        rows = hooks.features(model, audio).shape[0]
        ids = torch.tensor([[1, 40, 41] + [AUDIO_TOKEN] * rows + [42, 43]])
        generated = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **audio, max_new_tokens=NEW_TOKENS,
                                   min_new_tokens=NEW_TOKENS, do_sample=False)
    given = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             **{renamed.get(name, name): value for name, value in audio.items()}}
    job = {"folder": str(out), "task": "text2text-generation", "audio_text": {"prompts": [tensor_specs(given)],
                                                                            "new_tokens": NEW_TOKENS}}
    results = run_in_transformers_js(transformers_js, scratch, job)["audio_text"]
    return results, [generated[0, ids.shape[1]:].tolist()]


def test_voxtral_folder_in_transformers_js(tmp_path, transformers_js):
    """Voxtral's audio-text-to-text folder in Transformers.js (AutoModelForAudioTextToText: its
    audio_encoder fed `audio_values`, the features merged into the audio tokens' rows in
    JavaScript): 16 greedy tokens equal transformers' for one clip's prompt."""
    from test_export_hf_audio_language import save_voxtral

    model = save_voxtral(tmp_path / "source")
    export_hf(tmp_path / "source", tmp_path / "out", task="text2text-generation")
    results, expected = audio_text_in_transformers_js(transformers_js, tmp_path, model, tmp_path / "out",
                                                      {"input_features": "audio_values"})
    assert results == expected and len(set(expected[0])) > 1


def test_granite_speech_folder_in_transformers_js(tmp_path, transformers_js):
    """Granite Speech's audio-text-to-text folder (verified in onnxruntime, each file through the
    full checker) in Transformers.js (AutoModelForAudioTextToText: GraniteSpeechForConditionalGeneration
    feeds the audio encoder `input_features` under transformers' name): 16 greedy tokens equal
    transformers' for one clip's prompt. Built without torchaudio, which only its feature extractor needs."""
    from test_export_hf_audio_language import PARTS, save_granite_speech

    model = save_granite_speech(tmp_path / "source")
    out = tmp_path / "out"
    verification = export_hf(tmp_path / "source", out, task="text2text-generation", verify=True, tokens=NEW_TOKENS).verification
    assert verification.passed and verification.tokens_equal and verification.max_logit_difference < 1e-4
    for name in PARTS:
        onnx.checker.check_model(os.fspath(out / "onnx" / f"{name}.onnx"), full_check=True)
    results, expected = audio_text_in_transformers_js(transformers_js, tmp_path, model, out, {})
    assert results == expected and len(expected[0]) == NEW_TOKENS and len(set(expected[0])) > 2


def test_voxtral_realtime_folder_in_transformers_js(tmp_path, transformers_js):
    """VoxtralRealtime's streaming folder (without module functions) in Transformers.js
    (AutoModelForAudioTextToText: VoxtralRealtimeForConditionalGeneration's generate takes the mel
    frames as an iterable of chunks, encodes them as the tokens need audio and adds each audio
    embedding to one token's): 16 greedy tokens equal transformers' `generate` on the whole clip,
    for a clip exactly as long as the tokens need in chunks of 2 tokens' frames and a longer
    one in chunks of 3 tokens', past the encoder's and decoder's sliding windows."""
    from fx2onnx.hub.audio_language.voxtral_realtime_verification import verification_prompt
    from test_export_hf_audio_language import save_voxtral_realtime

    model = save_voxtral_realtime(tmp_path / "source")
    export_hf(tmp_path / "source", tmp_path / "out", task="text2text-generation", module_functions=False)
    prompt = torch.tensor([verification_prompt(model)])
    per_token, prompts, expected = model.config.audio_length_per_tok, [], []
    for extra, chunk_tokens in ((0, 2), (5, 3)):
        frames = (prompt.shape[1] + NEW_TOKENS + extra) * per_token
        features = torch.randn(1, 16, frames, generator=torch.Generator().manual_seed(extra))
        with torch.no_grad():
            generated = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), input_features=features,
                                       max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
        expected.append(generated[0, prompt.shape[1]:].tolist())
        cuts = list(range(prompt.shape[1] * per_token, frames, chunk_tokens * per_token))
        chunks = torch.tensor_split(features, cuts, dim=-1)
        prompts.append({**tensor_specs({"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}),
                        "chunks": [tensor_specs({"chunk": chunk})["chunk"] for chunk in chunks]})
    job = {"folder": str(tmp_path / "out"), "task": "text2text-generation",
           "audio_text": {"prompts": prompts, "new_tokens": NEW_TOKENS}}
    results = run_in_transformers_js(transformers_js, tmp_path, job)["audio_text"]
    assert results == expected and all(len(set(tokens)) > 4 for tokens in expected)


def save_gemma4(folder: Path, **layers) -> torch.nn.Module:
    """A tiny Gemma 4 without encoders: per-layer inputs, two sliding layers of 8 tokens, then a
    full one (the last layer always is) with wider heads; ``layers`` overrides those."""
    torch.manual_seed(0)
    layers = {"num_hidden_layers": 3, "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]} | layers
    text = transformers.Gemma4TextConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        global_head_dim=16, hidden_size_per_layer_input=8, vocab_size_per_layer_input=100, sliding_window=8,
        max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, **layers)
    config = transformers.Gemma4Config(text_config=text.to_dict(), vision_config=None, audio_config=None)
    model = transformers.Gemma4ForConditionalGeneration(config).eval()
    model.save_pretrained(folder)
    return model


def shapes(values) -> dict[str, list]:
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}


def export_with_transformers_js_pair(source: Path, out: Path) -> None:
    """export-hf's text-generation folder of ``source``, verified (tokens equal), its embedding and
    decoder for Transformers.js verified too, and no note that a client cannot load it."""
    said = []
    result = export_hf(source, out, task="text-generation", say=said.append, verify=True, tokens=NEW_TOKENS)
    assert result.verification.passed and result.verification.tokens_equal
    assert [line for line in said if "(Transformers.js's models) too" in line]
    assert not [line for line in said if "cannot load" in line]


def test_gemma4_folder_in_transformers_js_and_genai(tmp_path, transformers_js):
    """Gemma 4's folder holds Transformers.js's `embed_tokens` (ids -> embeddings and per-layer
    inputs) and `decoder_model_merged` beside its model, each verified in onnxruntime as its client
    feeds it: 16 greedy tokens equal transformers' in Transformers.js (alone and left-padded) and
    in ONNX Runtime GenAI, past the sliding window of 8."""
    from fx2onnx.hub.shared.verification import plain_greedy
    from test_export_hf import genai_greedy

    model = save_gemma4(tmp_path / "source")
    export_with_transformers_js_pair(tmp_path / "source", tmp_path / "out")
    folder = tmp_path / "out" / "onnx"
    for name in ("model", "embed_tokens", "decoder_model_merged"):
        onnx.checker.check_model(onnx.load(folder / f"{name}.onnx"), full_check=True)
    embedding = onnx.load(folder / "embed_tokens.onnx", load_external_data=False).graph
    assert list(shapes(embedding.input)) == ["input_ids"]
    assert shapes(embedding.output) == {"inputs_embeds": ["batch_size", "sequence_length", 32],
                                        "per_layer_inputs": ["batch_size", "sequence_length", 3, 8]}
    decoder = shapes(onnx.load(folder / "decoder_model_merged.onnx", load_external_data=False).graph.input)
    assert set(decoder) == {"inputs_embeds", "per_layer_inputs", "attention_mask", "position_ids",
                            *(f"past_key_values.{i}.{kind}" for i in range(3) for kind in ("key", "value"))}
    assert decoder["past_key_values.0.key"][3] == 8 and decoder["past_key_values.2.key"][3] == 16
    # the pair's dims as the folder's model has them: only the roles free, every size the config fixes concrete
    pair = onnx.load(folder / "decoder_model_merged.onnx", load_external_data=False).graph
    whole = onnx.load(folder / "model.onnx", load_external_data=False).graph
    in_pair, in_whole = {**decoder, **shapes(pair.output)}, {**shapes(whole.input), **shapes(whole.output)}
    assert {name: in_pair[name] for name in in_whole if name != "input_ids"} == {
        name: dims for name, dims in in_whole.items() if name != "input_ids"}
    assert decoder["inputs_embeds"] == ["batch_size", "sequence_length", 32]
    assert decoder["per_layer_inputs"] == ["batch_size", "sequence_length", 3, 8]
    assert {dim for dims in in_pair.values() for dim in dims if isinstance(dim, str)} == {
        "batch_size", "sequence_length", "past_sequence_length", "total_sequence_length"}
    assert_generates_as_transformers(transformers_js, tmp_path, tmp_path / "out", model)  # up to 25 tokens
    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai does not install on this platform")
    genai = og.Model(str(tmp_path / "out"))
    for prompt in ([5, 17, 42, 8], [9, 3, 77, 31, 60, 12, 4, 50, 21]):
        with plain_greedy(model):
            expected = greedy(model, torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.int64))[0]
        assert genai_greedy(genai, prompt, NEW_TOKENS) == expected


def test_gemma4_kv_shared_layers_in_transformers_js_and_genai(tmp_path, transformers_js):
    """Gemma 4 as its E2B/E4B checkpoints are: its last layers (a sliding one, a full one)
    attend to the keys and values of the last earlier layer of their type. Its folder's cache
    holds the other layers' only, as transformers' and Transformers.js's do: 16 greedy tokens
    equal transformers' in onnxruntime (a left-padded batch too) and in Transformers.js, past
    the sliding window of 8; ONNX Runtime GenAI runs the folder's model with past and present
    apart (its shared buffer, the context long, is not the cache those layers read): the same
    tokens, a batch too (padded on the right, as GenAI pads), with logits within 1e-4."""
    from fx2onnx.hub.shared.verification import greedy_in_folder, greedy_in_genai, plain_greedy

    kinds = ["sliding_attention", "full_attention"] * 2
    model = save_gemma4(tmp_path / "source", num_hidden_layers=4, layer_types=kinds, num_kv_shared_layers=2)
    assert model.config.text_config.kv_sharing_modes == ["store", "store", "reuse", "reuse"]
    said = []
    result = export_hf(tmp_path / "source", tmp_path / "out", task="text-generation", say=said.append, verify=True,
                       tokens=NEW_TOKENS)
    assert result.verification.passed and result.verification.tokens_equal
    assert [line for line in said if "(Transformers.js's models) too" in line]
    assert [line for line in said if line.startswith("genai_config.json with past and present apart")]
    folder = tmp_path / "out" / "onnx"
    cache = {f"past_key_values.{i}.{kind}" for i in range(2) for kind in ("key", "value")}
    for name in ("model", "embed_tokens", "decoder_model_merged"):
        graph = onnx.load(folder / f"{name}.onnx")
        onnx.checker.check_model(graph, full_check=True)
        assert {v.name for v in graph.graph.input if v.name.startswith("past_")} == (set() if name == "embed_tokens" else cache)
    assert_generates_as_transformers(transformers_js, tmp_path, tmp_path / "out", model)  # up to 25 tokens
    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai does not install on this platform")
    genai = json.loads((tmp_path / "out" / "genai_config.json").read_text())
    assert genai["model"]["decoder"]["filename"] == "onnx/model.onnx" and "sliding_window" not in genai["model"]["decoder"]
    assert genai["search"]["past_present_share_buffer"] is False
    prompts = [[5, 17, 42, 8], [9, 3, 77, 31, 60, 12, 4, 50, 21, 33, 6]]
    ids, mask = left_padded(prompts)
    with plain_greedy(model):
        expected = greedy(model, torch.tensor(ids), torch.tensor(mask))
    right = [prompt + [0] * (len(ids[0]) - len(prompt)) for prompt in prompts]
    generated = greedy_in_genai(og.Model(str(tmp_path / "out")), right, NEW_TOKENS, logits=True)
    assert generated.tokens == expected  # to 27 tokens, past the window of 8
    # the decode steps' logits against onnxruntime's on the folder's model (the prefill's last column
    # is a padding token's in GenAI's right-padded row; its end token is held back by min_length)
    reference = greedy_in_folder(folder / "model.onnx", prompts, NEW_TOKENS, pad=0, banned=[2])
    assert reference.tokens == expected
    for got, want in zip(generated.logits[1:], reference.logits[1:]):
        np.testing.assert_allclose(np.delete(got, 2, -1), np.delete(want, 2, -1), rtol=0, atol=1e-4)


def test_gemma4_int4_folder_with_module_functions_in_transformers_js_and_genai(tmp_path, transformers_js, monkeypatch):
    """A Gemma 4 `--precision int4 --module-functions` folder with KV-shared layers (a sliding
    and a full one reusing the earlier layers' keys and values): `--verify` checks
    Transformers.js's `embed_tokens_q4` and `decoder_model_merged_q4` beside `model_q4` (a
    pair giving other logits fails it), Transformers.js's 16 greedy tokens (alone and as a
    left-padded batch, past the window of 8) are onnxruntime's on that pair, and GenAI's
    config keeps past and present apart (the shared layers' reads are inside the int4 graph's
    branches): GenAI generates what onnxruntime generates on `model_q4.onnx`."""
    from fx2onnx.hub.recipes import causal_lm
    from fx2onnx.hub.shared.verification import greedy_in_folder, greedy_in_genai, verify_quantized_causal_lm

    kinds = ["sliding_attention", "full_attention"] * 2
    model = save_gemma4(tmp_path / "source", num_hidden_layers=4, layer_types=kinds, num_kv_shared_layers=2)
    checked = []

    def spied(path, *args, embedding=None, **kwargs):
        checked.append((path.name, embedding.name if embedding else None))
        return verify_quantized_causal_lm(path, *args, embedding=embedding, **kwargs)

    monkeypatch.setattr(causal_lm, "verify_quantized_causal_lm", spied)
    said = []
    # int4 of a 32-wide model moves its logits by up to 0.45 (of 0.35), as rounding its weights alone does: judged
    # against the model with its weights rounded so
    result = export_hf(tmp_path / "source", tmp_path / "out", task="text-generation", precision="int4", module_functions=True,
                       verify=True, tokens=NEW_TOKENS, say=said.append)
    assert result.verification.passed and result.verification.own_error > 0.1
    assert checked == [("model_q4.onnx", None), ("decoder_model_merged_q4.onnx", "embed_tokens_q4.onnx")]
    assert [line for line in said if line.startswith("genai_config.json with past and present apart")]
    folder = tmp_path / "out" / "onnx"
    for name in ("model_q4", "embed_tokens_q4", "decoder_model_merged_q4"):
        graph = onnx.load(folder / f"{name}.onnx")
        onnx.checker.check_model(graph, full_check=True)
        assert graph.functions or name == "embed_tokens_q4"
    assert_generates_as_onnxruntime(transformers_js, tmp_path, tmp_path / "out", "decoder_model_merged_q4.onnx",
                                    "embed_tokens_q4.onnx")
    # the pair's logits tripled: its verification fails where model_q4's passes
    tripled = onnx.load(folder / "decoder_model_merged_q4.onnx", load_external_data=False)
    logits = next(n for n in tripled.graph.node if "logits" in n.output)
    logits.output[list(logits.output).index("logits")] = "logits/raw"
    tripled.graph.node.extend([
        onnx.helper.make_node("Constant", [], ["logits/three"], value=onnx.helper.make_tensor("three", 1, [], [3.0])),
        onnx.helper.make_node("Mul", ["logits/raw", "logits/three"], ["logits"])])
    onnx.save(tripled, folder / "decoder_model_merged_q4.onnx")
    prompt = [5, 17, 42, 8, 9, 3]
    assert verify_quantized_causal_lm(folder / "model_q4.onnx", model, model.config, prompt, NEW_TOKENS).passed
    assert not verify_quantized_causal_lm(folder / "decoder_model_merged_q4.onnx", model, model.config, prompt, NEW_TOKENS,
                                          embedding=folder / "embed_tokens_q4.onnx").passed
    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai does not install on this platform")
    genai = json.loads((tmp_path / "out" / "genai_config.json").read_text())
    assert genai["search"]["past_present_share_buffer"] is False
    prompt = [9, 3, 77, 31, 60, 12, 4, 50, 21]
    expected = greedy_in_folder(folder / "model_q4.onnx", [prompt], NEW_TOKENS, pad=0, banned=[2]).tokens
    assert greedy_in_genai(og.Model(str(tmp_path / "out")), [prompt], NEW_TOKENS).tokens == expected


# Gemma 4's image, audio and video token ids in the tiny models' vocabulary of 300 (ids past the text's 280)
GEMMA4_TOKENS = dict(image_token_id=290, audio_token_id=291, boi_token_id=292, eoi_token_id=293, boa_token_id=294,
                     eoa_token_id=295, video_token_id=296)
# their texts, in that order, as the tokenizer's special tokens name them (its roles: Gemma4Processor reads them)
GEMMA4_TOKEN_TEXTS = {"image_token": "<image_soft_token>", "audio_token": "<audio_soft_token>", "boi_token": "<start_of_image>",
                      "eoi_token": "<end_of_image>", "boa_token": "<start_of_audio>", "eoa_token": "<end_of_audio>",
                      "video_token": "<video_soft_token>"}


# Gemma 3n's language model as its E2B and E4B checkpoints are: per-layer inputs from a table of the text
# vocabulary alone (256 of 400 ids), AltUp, LAuReL, a sparse first layer, sliding layers of 8 tokens, the last
# sliding and full layer reusing the earlier layers' keys and values
GEMMA3N_TEXT = dict(
    vocab_size=400, vocab_size_per_layer_input=256, hidden_size=32, hidden_size_per_layer_input=8, intermediate_size=64,
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    layer_types=["sliding_attention", "full_attention"] * 2, num_kv_shared_layers=2, sliding_window=8, laurel_rank=8,
    activation_sparsity_pattern=[0.95, 0.0, 0.0, 0.0], max_position_embeddings=256, pad_token_id=0, bos_token_id=2,
    eos_token_id=1)


def test_gemma3n_text_folder_in_transformers_js(tmp_path, transformers_js):
    """Gemma 3n's language model (Gemma3nForCausalLM, gemma3n_text, for which Transformers.js has no
    class): its folder holds the embedding and decoder of Transformers.js's gemma3n class, which
    config.json names (Gemma3nForConditionalGeneration, the sizes under text_config), with the
    cache of the two layers that store keys and values; export-hf verifies both in onnxruntime, and
    16 greedy tokens in Transformers.js equal transformers' (alone and left-padded), past the
    sliding window of 8."""
    torch.manual_seed(0)
    model = transformers.Gemma3nForCausalLM(transformers.Gemma3nTextConfig(**GEMMA3N_TEXT)).eval()
    model.save_pretrained(tmp_path / "source")
    export_with_transformers_js_pair(tmp_path / "source", tmp_path / "out")
    graphs = checked_graphs(tmp_path / "out", ("model", "embed_tokens", "decoder_model_merged"))
    assert shapes(graphs["embed_tokens"].output) == {"inputs_embeds": ["batch_size", "sequence_length", 32],
                                                     "per_layer_inputs": ["batch_size", "sequence_length", 4, 8]}
    assert {i.name for i in graphs["decoder_model_merged"].input if i.name.startswith("past_")} == {
        f"past_key_values.{i}.{kind}" for i in range(2) for kind in ("key", "value")}
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "gemma3n" and config["architectures"] == ["Gemma3nForConditionalGeneration"]
    assert config["text_config"]["model_type"] == "gemma3n_text"
    assert config["text_config"]["num_kv_shared_layers"] == 2
    assert_generates_as_transformers(transformers_js, tmp_path, tmp_path / "out", model)  # up to 25 tokens


def save_gemma4_tokenizer(folder: Path) -> None:
    """A byte-level BPE tokenizer of 290 tokens with Gemma 4's special tokens after them (GEMMA4_TOKENS' ids)."""
    model = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=290, special_tokens=["<pad>", "<bos>", "<eos>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    model.train_from_iterator(["the quick brown fox jumps over the lazy dog describe this image\n\n"] * 40, trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=model, bos_token="<bos>", eos_token="<eos>",
                                                     pad_token="<pad>")
    tokenizer.add_special_tokens({"additional_special_tokens": list(GEMMA4_TOKEN_TEXTS.values())})
    assert tokenizer.convert_tokens_to_ids(list(GEMMA4_TOKEN_TEXTS.values())) == list(GEMMA4_TOKENS.values())
    tokenizer.save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(folder, extra_special_tokens=GEMMA4_TOKEN_TEXTS).save_pretrained(folder)


def save_gemma4_multimodal(folder: Path) -> torch.nn.Module:
    """A tiny Gemma 4 as its E2B and E4B checkpoints are (per-layer inputs, sliding layers of 8 tokens,
    the last sliding and full layer reusing the earlier layers' keys and values) with a two-layer
    vision tower (4-pixel patches pooled 2 x 2, at most 70 tokens an image), a two-layer audio
    conformer and Gemma 4's image processor."""
    torch.manual_seed(0)
    text = transformers.Gemma4TextConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        global_head_dim=16, hidden_size_per_layer_input=8, vocab_size_per_layer_input=300, sliding_window=8,
        max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2, num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention"] * 2, num_kv_shared_layers=2)
    vision = transformers.Gemma4VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
        pooling_kernel_size=2, patch_size=4, position_embedding_size=64)
    # the subsampling's first channels are the mel bins (128), which its projection is sized by
    audio = transformers.Gemma4AudioConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           subsampling_conv_channels=[128, 4], output_proj_dims=32, conv_kernel_size=3)
    config = transformers.Gemma4Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                       audio_config=audio.to_dict(), **GEMMA4_TOKENS)
    model = transformers.Gemma4ForConditionalGeneration(config).eval()
    model.save_pretrained(folder)
    transformers.Gemma4ImageProcessorPil(patch_size=4, max_soft_tokens=70, pooling_kernel_size=2).save_pretrained(folder)
    save_gemma4_tokenizer(folder)
    return model


def gemma4_prompts(model: torch.nn.Module) -> tuple[list[dict], list[dict]]:
    """transformers' processed inputs (as Gemma4Processor lays out the tokens) of a wide image, a tall
    one, a prompt without an image, an audio clip, an image and the clip in one prompt, and a
    left-padded batch of two images of other sizes (a prompt's ids, mask, pixels and clip; the
    patches of each image padded to 70 pooled tokens)."""
    config = model.config
    image_processor = transformers.Gemma4ImageProcessorPil(patch_size=4, max_soft_tokens=70, pooling_kernel_size=2)
    text = [5, 17, 42, 8, 9, 3, 77, 31]

    def image_row(image, words) -> tuple[list[int], dict]:
        processed = image_processor(images=[image], return_tensors="pt")
        count = int(processed["num_soft_tokens_per_image"][0])
        ids = [1, *words[:3], config.boi_token_id, *[config.image_token_id] * count, config.eoi_token_id, *words[3:]]
        return ids, {"pixel_values": processed["pixel_values"], "image_position_ids": processed["image_position_ids"]}

    prompts = []
    for image in (random_image(30, 50, 0), random_image(70, 25, 1)):
        ids, pixels = image_row(image, text)
        prompts.append({"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.int64), **pixels})
    prompts.append({"input_ids": torch.tensor([[1, *text]]), "attention_mask": torch.ones(1, len(text) + 1, dtype=torch.int64)})
    clip = np.random.default_rng(2).standard_normal(12000).astype(np.float32) * 0.1
    audio = transformers.Gemma4AudioFeatureExtractor()([clip], sampling_rate=16000, return_tensors="pt")
    with torch.no_grad():
        count = int(model.model.get_audio_features(audio["input_features"], audio["input_features_mask"]).attention_mask.sum())
    ids = [1, *text[:2], config.boa_token_id, *[config.audio_token_id] * count, config.eoa_token_id, *text[2:]]
    clip_inputs = {"input_features": audio["input_features"], "input_features_mask": audio["input_features_mask"]}
    prompts.append({"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.int64),
                    **clip_inputs})
    image_ids, pixels = image_row(random_image(50, 30, 5), ids[1:])  # the image before the clip, in one prompt
    prompts.append({"input_ids": torch.tensor([image_ids]), "attention_mask": torch.ones(1, len(image_ids), dtype=torch.int64),
                    **pixels, **clip_inputs})
    rows = [image_row(random_image(40, 40, 3), text), image_row(random_image(20, 60, 4), text[:5])]
    prompts.append(left_padded_batch([ids for ids, _ in rows], **{
        name: torch.cat([pixels[name] for _, pixels in rows]) for name in ("pixel_values", "image_position_ids")}))
    return jobs_and_greedy_rows(model, prompts)


def left_padded_batch(rows: list[list[int]], **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """A batch of ``rows`` of ids padded on the left with 0, its mask and ``inputs``."""
    width = max(len(ids) for ids in rows)
    return {"input_ids": torch.tensor([[0] * (width - len(ids)) + ids for ids in rows]),
            "attention_mask": torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in rows]), **inputs}


def jobs_and_greedy_rows(model: torch.nn.Module, prompts: list[dict]) -> tuple[list[dict], list[list[list[int]]]]:
    """Each prompt as the runner's image_text jobs give it, and transformers' 16 greedy tokens after
    it (a list per row)."""
    expected = []
    for given in prompts:
        with torch.no_grad():
            out = model.generate(**given, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        expected.append(out[:, given["input_ids"].shape[1]:].tolist())
    return [{"inputs": tensor_specs(given)} for given in prompts], expected


def assert_per_layer_folder(out: Path, graphs: dict, model_type: str, architecture: str, stored_layers: int) -> None:
    """The audio model's inputs, the embedding's outputs and the decoder's inputs as Transformers.js's
    Gemma3nForConditionalGeneration (Gemma 4's base) feeds and reads them, the cache of the
    ``stored_layers`` layers that store keys and values alone, and config.json's model type and
    class as transformers has them."""
    assert [i.name for i in graphs["audio_encoder"].input] == ["input_features", "input_features_mask"]
    assert [o.name for o in graphs["embed_tokens"].output] == ["inputs_embeds", "per_layer_inputs"]
    decoder_inputs = {i.name for i in graphs["decoder_model_merged"].input}
    assert {"inputs_embeds", "per_layer_inputs", "attention_mask", "position_ids"} <= decoder_inputs
    assert {name for name in decoder_inputs if name.startswith("past_")} == {
        f"past_key_values.{i}.{kind}" for i in range(stored_layers) for kind in ("key", "value")}
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == model_type and config["architectures"] == [architecture]


def test_gemma4_image_audio_folder_in_transformers_js(tmp_path, transformers_js):
    """Gemma 4 with images and audio as `--runtime standard` writes it for Transformers.js's
    Gemma4ForConditionalGeneration: vision_encoder (the processor's padded patches and their
    positions -> a row per image token), audio_encoder (which Transformers.js loads whatever the
    prompt), embed_tokens with per-layer inputs, decoder_model_merged with the KV-shared layers'
    cache left out. export-hf's verification (two images of other sizes in one prompt, in
    onnxruntime) and 16 greedy tokens in Transformers.js equal transformers' on a wide image, a tall
    one, a prompt without an image, an audio clip, an image and the clip in one prompt, and a
    left-padded batch of two images, past the sliding window of 8."""
    model = save_gemma4_multimodal(tmp_path / "source")
    out = tmp_path / "out"
    said = []
    verification = export_hf(tmp_path / "source", out, runtime="standard", verify=True, tokens=NEW_TOKENS,
                             say=said.append).verification
    assert verification.passed and verification.onnx_tokens == verification.torch_tokens
    assert verification.max_logit_difference < 1e-4
    assert [line for line in said if "(Gemma4ForConditionalGeneration)" in line]
    graphs = checked_graphs(out, ("vision_encoder", "audio_encoder", "embed_tokens", "decoder_model_merged"))
    # the patches as the processor pads them (70 pooled tokens of 2 x 2 patches), images any in number
    assert shapes(graphs["vision_encoder"].input) == {"pixel_values": ["pixel_values_dim_0", 280, 48],
                                                      "pixel_position_ids": ["pixel_values_dim_0", 280, 2]}
    assert_per_layer_folder(out, graphs, "gemma4", "Gemma4ForConditionalGeneration", stored_layers=2)
    prompts, expected = gemma4_prompts(model)
    assert len({len(prompt["inputs"]["input_ids"]["data"]) for prompt in prompts[:2]}) == 2  # other token counts
    assert 0 in prompts[5]["inputs"]["attention_mask"]["data"]  # the batch is padded
    job = {"folder": str(out), "task": "image-text-to-text", "image_text": {"prompts": prompts, "new_tokens": NEW_TOKENS}}
    results = [result["generated_rows"] for result in run_in_transformers_js(transformers_js, tmp_path, job)["image_text"]]
    assert results == expected
    assert len({str(rows) for rows in expected[:5]}) == 5  # the images and the audio changed the tokens
    assert_gemma4_client_processor(tmp_path, transformers_js, out)


def assert_gemma4_client_processor(scratch: Path, transformers_js: Path, out: Path) -> None:
    """Why the Gemma 4 folder names no processor class: Transformers.js's Gemma4Processor (given
    the processor_config.json transformers 5 saves, the image processor nested) puts two
    newlines before and after each image's tokens (src/models/gemma4/processing_gemma4.js:79-81),
    where transformers' replace_image_token writes begin, image tokens, end; on an image of the
    processor's target size (48x80: 6 x 10 pooled tokens) its patches and their positions are
    transformers'."""
    from PIL import Image

    settings = json.loads((out / "preprocessor_config.json").read_text())
    assert "processor_class" not in settings
    (out / "processor_config.json").write_text(json.dumps({"image_processor": settings}))
    (out / "preprocessor_config.json").write_text(json.dumps({**settings, "processor_class": "Gemma4Processor"}))
    path = scratch / "48x80.png"
    random_image(48, 80, 0).save(path)
    text = "<bos>describe <image_soft_token> this image"
    job = {"folder": str(out), "task": "image-text-to-text",
           "image_text": {"prompts": [{"text": text, "images": [str(path)]}], "new_tokens": NEW_TOKENS}}
    client = client_tensors(run_in_transformers_js(transformers_js, scratch, job)["image_text"][0]["processed"])
    processed = transformers.Gemma4ImageProcessorPil.from_pretrained(out)(images=[Image.open(path)], return_tensors="pt")
    assert int(processed["num_soft_tokens_per_image"][0]) == 60
    image = "<start_of_image>" + "<image_soft_token>" * 60 + "<end_of_image>"
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    expected, newlines = (tokenizer(text.replace("<image_soft_token>", tokens), add_special_tokens=False)["input_ids"]
                          for tokens in (image, f"\n\n{image}\n\n"))
    assert client["input_ids"][0].tolist() == newlines != expected
    assert torch.equal(client["pixel_values"], processed["pixel_values"])
    assert torch.equal(client["image_position_ids"], processed["image_position_ids"])


def test_qwen2_moe_folder_in_transformers_js(tmp_path, transformers_js):
    """Qwen2-MoE's experts, weighed by the top k of the softmax without renormalizing, are
    onnxruntime's MoE renormalized times the top k's share (onnxruntime-node 1.30's kernel,
    Transformers.js's, gives zeros for normalize_routing_weights=0 inside a graph): its logits
    in Transformers.js within 1e-4 of transformers', 16 greedy tokens equal."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.Qwen2MoeConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, shared_expert_intermediate_size=32,
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)).eval()
    for name, parameter in model.named_parameters():  # the experts' share of the output well above float noise
        if ".mlp.experts." in name:
            torch.nn.init.normal_(parameter, std=0.5)
    model.save_pretrained(tmp_path / "source")
    result = export_hf(tmp_path / "source", tmp_path / "out", verify=True, tokens=NEW_TOKENS)
    assert result.verification.passed and result.verification.tokens_equal
    path = tmp_path / "out" / "onnx" / "model.onnx"
    onnx.checker.check_model(onnx.load(path), full_check=True)
    kernels = [n for n in onnx.load(path, load_external_data=False).graph.node if n.op_type == "MoE"]
    assert len(kernels) == 2
    assert all(onnx.helper.get_attribute_value(a) == 1 for n in kernels for a in n.attribute
               if a.name == "normalize_routing_weights")
    ids = torch.tensor([[9, 3, 77, 31, 60, 12, 4, 50, 21]])
    result = run_in_transformers_js(transformers_js, tmp_path, {
        "folder": str(tmp_path / "out"), "task": "text-generation", "outputs": ["logits"],
        "inputs": tensor_specs({"input_ids": ids, "attention_mask": torch.ones_like(ids)})})
    logits = result["outputs"]["logits"]
    with torch.no_grad():
        expected = model(ids, attention_mask=torch.ones_like(ids)).logits
    assert logits["dims"] == list(expected.shape)
    np.testing.assert_allclose(np.array(logits["data"]).reshape(logits["dims"]), expected.numpy(), rtol=0, atol=1e-4)
    assert_generates_as_transformers(transformers_js, tmp_path, tmp_path / "out", model)


def save_florence2(folder):
    """A two-layer Florence-2 (a two-stage DaViT tower of 32-pixel images, 17 image tokens each; a
    BART of two layers each side) with its processor: a byte-level tokenizer that wraps text in
    `<s>` and `</s>` as BART's does, with an `<image>` token, and a CLIP image processor resizing
    every image to 32 x 32."""
    backend = trained_tokenizer()._tokenizer
    backend.add_special_tokens(["<image>"])
    backend.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                                     extra_special_tokens={"image_token": "<image>"})
    text = dict(vocab_size=len(tokenizer), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
                pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2)
    vision = dict(depths=[1, 1], patch_size=[7, 3], patch_stride=[4, 2], patch_padding=[3, 1], patch_prenorm=[False, True],
                  embed_dim=[16, 32], num_heads=[2, 4], num_groups=[2, 4], window_size=2, projection_dim=32,
                  max_position_embeddings=16, max_temporal_embeddings=8)
    config = transformers.Florence2Config(text_config=text, vision_config=vision,
                                          image_token_id=tokenizer.convert_tokens_to_ids("<image>"))
    torch.manual_seed(0)
    model = transformers.Florence2ForConditionalGeneration(config).eval()
    spread_weights(model)  # the tokens then depend on the image and the task
    model.save_pretrained(folder)
    image_processor = transformers.CLIPImageProcessorPil(size={"height": 32, "width": 32}, do_center_crop=False)
    image_processor.image_seq_length = (32 // 8) ** 2 + 1  # a token per cell of the tower's 4 x 4 grid, and their mean
    processor = transformers.Florence2Processor(image_processor=image_processor, tokenizer=tokenizer)
    processor.save_pretrained(folder)
    return model, processor


def test_florence2_folder_in_transformers_js(tmp_path, transformers_js):
    """Florence-2 as `--runtime standard` writes it for Transformers.js (an encoder-decoder: its
    vision_encoder, embed_tokens, encoder_model and merged decoder; Transformers.js puts the image
    features before the prompt's embeddings): export-hf's verification in onnxruntime (written in
    fake mode), and 16 greedy tokens in Transformers.js equal transformers' `generate` on
    transformers' processed inputs (images of two other sizes and aspect ratios with two task
    prompts, both in one right-padded batch, and a prompt without an image) and through
    Transformers.js's own Florence2Processor (its task prompts expanded from the folder's
    preprocessor_config.json) on an image of the processor's size."""
    from fx2onnx.hub.vision_language.florence2_verify import random_image, transformers_js_inputs

    model, processor = save_florence2(tmp_path / "source")
    out = tmp_path / "out"
    verification = export_hf(tmp_path / "source", out, task="image-text-to-text", runtime="standard", verify=True,
                             tokens=4, fake=True).verification
    assert verification.passed and verification.tokens_equal and len(verification.onnx_tokens) == 4
    for name in ("vision_encoder", "embed_tokens", "encoder_model", "decoder_model_merged"):
        onnx.checker.check_model(os.fspath(out / "onnx" / f"{name}.onnx"), full_check=True)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "florence2" and config["architectures"] == ["Florence2ForConditionalGeneration"]
    preprocessor = json.loads((out / "preprocessor_config.json").read_text())
    assert preprocessor["processor_class"] == "Florence2Processor"
    assert preprocessor["task_prompts_without_inputs"]["<CAPTION>"] == processor.task_prompts_without_inputs["<CAPTION>"]
    # transformers reads the folder's processor files as the source's
    written = transformers.AutoProcessor.from_pretrained(out)(text="<OD>", images=random_image(40, 60, 5), return_tensors="pt")
    source = processor(text="<OD>", images=random_image(40, 60, 5), return_tensors="pt")
    assert all(torch.equal(written[k], source[k]) for k in ("input_ids", "attention_mask", "pixel_values"))

    image = int(model.config.image_token_id)
    prompts, expected = [], []

    def add(given: dict, js_inputs: dict | None = None) -> None:
        with torch.no_grad():
            generated = model.generate(**given, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
        expected.append(generated[:, 1:].tolist())  # after the decoder start token
        if js_inputs is not None:
            prompts.append({"inputs": tensor_specs({k: torch.from_numpy(v) for k, v in js_inputs.items()})})

    images = [random_image(50, 70, 0), random_image(90, 40, 1)]
    for task, picture in zip(("<CAPTION>", "<OD>"), images):
        given = dict(processor(text=task, images=picture, return_tensors="pt"))
        add(given, transformers_js_inputs(given, image))
    batch = dict(processor(text=["<CAPTION>", "<OD>"], images=images, padding=True, return_tensors="pt"))
    assert batch["attention_mask"][0, -1] == 0  # the shorter prompt padded on the right, as BART's tokenizer pads
    add(batch, transformers_js_inputs(batch, image))
    text = {k: v for k, v in processor.tokenizer("What does the image describe?", return_tensors="pt").items()
            if k in ("input_ids", "attention_mask")}
    add(text, {k: v.numpy() for k, v in text.items()})
    for seed, task in ((3, "<CAPTION>"), (4, "<OD>")):  # through Transformers.js's processor: no resize
        path = tmp_path / f"{seed}.png"
        random_image(32, 32, seed).save(path)
        from PIL import Image

        add(dict(processor(text=task, images=Image.open(path), return_tensors="pt")))
        prompts.append({"text": task, "images": [os.fspath(path)]})
    job = {"folder": str(out), "task": "image-text-to-text", "image_text": {"prompts": prompts, "new_tokens": NEW_TOKENS}}
    results = run_in_transformers_js(transformers_js, tmp_path, job)["image_text"]
    assert [result["generated_rows"] for result in results] == expected
    assert expected[0] != expected[1] and expected[0] != expected[3] and expected[4] != expected[5]  # images and tasks count


# LFM2-VL's image tokens and its tiles' position tokens (up to 4 x 4 tiles)
LFM2_VL_SPECIAL = ["<image>", "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>",
                   *[f"<|img_row_{row}_col_{column}|>" for row in range(1, 5) for column in range(1, 5)]]
# transformers' Lfm2VlImageProcessor settings as it saves them, scaled down: 8-pixel patches, 32-pixel tiles (2 x 2 image
# tokens), 4 to 16 tokens for an image or thumbnail, 2 to 4 tiles for one larger than twice that
LFM2_VL_PROCESSOR = {
    "image_processor_type": "Lfm2VlImageProcessor", "downsample_factor": 2, "encoder_patch_size": 8, "tile_size": 32,
    "min_tiles": 2, "max_tiles": 4, "use_thumbnail": True, "min_image_tokens": 4, "max_image_tokens": 16,
    "max_pixels_tolerance": 2.0, "do_image_splitting": True, "do_resize": True, "size": {"height": 32, "width": 32},
    "resample": 2, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5], "do_pad": True, "return_row_col_info": False,
}
# image (height, width) -> the spatial shapes (patch grids) of its tiles as Transformers.js's processor gives them: one
# tile; an image past twice the most tokens, cut into 1 x 2 tiles with a thumbnail; one scaled up to the fewest tokens.
# transformers' gives the last two the same; the first 4 x 8: 40 / 16 is 2.5, which Python's round takes to 2 and
# JavaScript's Math.round to 3 (smart_resize's side in multiples of patch x downsample factor)
LFM2_VL_IMAGES = {(40, 70): [[6, 8]], (190, 130): [[4, 4], [4, 4], [8, 6]], (20, 30): [[4, 6]]}


def save_lfm2_vl(folder):
    """A three-layer LFM2-VL (a two-layer SigLIP2 tower of 8-pixel patches, an LFM2 text model of two
    convolution layers around one of attention) with LFM2-VL's image tokens and image processor
    settings (LFM2_VL_PROCESSOR: written as a file, transformers' class needs torchvision)."""
    tokenizer = trained_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": LFM2_VL_SPECIAL})
    text = dict(model_type="lfm2", vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention", "conv"],
                max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    vision = dict(model_type="siglip2_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, patch_size=8, num_patches=16, vision_use_head=False)
    config = transformers.Lfm2VlConfig(text_config=text, vision_config=vision, projector_hidden_size=48,
                                       image_token_id=tokenizer.convert_tokens_to_ids("<image>"), downsample_factor=2)
    torch.manual_seed(0)
    model = transformers.Lfm2VlForConditionalGeneration(config).eval()
    spread_weights(model)  # the tokens then depend on the image
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(LFM2_VL_PROCESSOR), encoding="utf-8")
    return model


def from_specs(specs: dict) -> dict[str, torch.Tensor]:
    """The runner's tensors (type, dims, data) as torch tensors."""
    kinds = {"float32": torch.float32, "bool": torch.bool, "int64": torch.int64}
    return {name: torch.tensor(spec["data"], dtype=kinds[spec["type"]]).reshape(spec["dims"]) for name, spec in specs.items()}


def lfm2_vl_padded_batch(model) -> dict[str, torch.Tensor]:
    """Two prompts of one tile each (other grids, the processor's layout), the second left-padded."""
    from fx2onnx.hub.vision_language.lfm2_vl import tiles

    image_id = model.config.image_token_id
    pixels = tiles(model.config, ((4, 6), (6, 4)), 64, seed=3)
    rows, mask = left_padded([[1, 40] + [image_id] * 6 + [41, 42, 43, 44], [45] + [image_id] * 6 + [46]])
    return {"input_ids": torch.tensor(rows), "attention_mask": torch.tensor(mask), **pixels}


def padded_batch_in_onnxruntime(folder, model, given: dict[str, torch.Tensor], vision_inputs: tuple[str, ...]) -> list[list[int]]:
    """The folder's three models' greedy tokens in onnxruntime for the left-padded batch ``given``
    (its ``vision_inputs`` fed to the vision model), the image features merged as Transformers.js
    merges them, with transformers' mask and positions (those Transformers.js 4.3 does not keep:
    padded_batch_tokens)."""
    from fx2onnx.hub.shared.verification import cpu_session, empty_cache, end_tokens, greedy_decode, run_session
    from fx2onnx.hub.vision_language.folder_verification import merged_features

    files = [folder / "onnx" / f"{name}.onnx" for name in ("vision_encoder", "embed_tokens", "decoder_model_merged")]
    rows = [row[mask.bool()].tolist() for row, mask in zip(given["input_ids"], given["attention_mask"])]
    with cpu_session(files[0]) as vision, cpu_session(files[1]) as embedding, cpu_session(files[2]) as decoder:
        features = run_session(vision, {name: given[name].numpy() for name in vision_inputs})["image_features"]

        def feed(step: np.ndarray, mask: np.ndarray, index: int) -> dict[str, np.ndarray]:
            embeds = run_session(embedding, {"input_ids": step})["inputs_embeds"]
            if index == 0:
                embeds = merged_features(step, embeds, features, int(model.config.image_token_id))
            positions = np.where(mask == 0, 1, np.cumsum(mask, -1) - 1)[:, -step.shape[1]:]  # as transformers' generate
            return {"inputs_embeds": embeds, "attention_mask": mask, "position_ids": positions}

        return greedy_decode(lambda inputs: run_session(decoder, inputs), empty_cache(decoder, batch=len(rows)), rows,
                             NEW_TOKENS, banned=end_tokens(model), feed=feed).tokens


def written_and_verified(source, out, model, fake: bool = False) -> None:
    """export-hf's Transformers.js folder of ``source`` written into ``out`` (in fake mode with
    ``fake``) with its verification (the three models in onnxruntime against ``model``, 4 tokens),
    every file passing the full checker, config.json keeping the model's type and class."""
    verification = export_hf(source, out, runtime="standard", verify=True, tokens=4, fake=fake).verification
    assert verification.passed and verification.onnx_tokens == verification.torch_tokens
    checked_graphs(out)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == model.config.model_type and config["architectures"] == [type(model).__name__]


def test_lfm2_vl_folder_in_transformers_js(tmp_path, transformers_js):
    """LFM2-VL as `--runtime standard` writes it for Transformers.js (a vision_encoder over the tiles its
    Lfm2VlProcessor cuts, 1-D positions, the LFM2 convolution states as past_conv.<layer>; written in fake mode):
    export-hf's verification (the three models in onnxruntime) and 16 greedy tokens in Transformers.js equal
    transformers' on the inputs Transformers.js's processor gives: an image of one tile, one cut into tiles with a
    thumbnail, one scaled up, two in one prompt, a prompt without images, and left-padded batches: of text alone
    (exact) and with images (as far as Transformers.js keeps its padding: padded_batch_tokens; all 16 tokens of both
    rows in onnxruntime with transformers' mask and positions)."""
    from PIL import Image

    source, out = tmp_path / "source", tmp_path / "out"
    model = save_lfm2_vl(source)
    written_and_verified(source, out, model, fake=True)  # each part's weights read by the checkpoint's names
    settings = json.loads((out / "preprocessor_config.json").read_text())
    assert settings["processor_class"] == "Lfm2VlProcessor" and settings["do_resize"] is False
    decoder = onnx.load(out / "onnx" / "decoder_model_merged.onnx", load_external_data=False)
    assert {"past_conv.0", "past_key_values.1.key", "past_conv.2"} <= {value.name for value in decoder.graph.input}
    paths = []
    for seed, (height, width) in enumerate(LFM2_VL_IMAGES):
        paths.append(tmp_path / f"{height}x{width}.png")
        Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)).save(paths[-1])
    prompts = [{"text": "<image>the quick brown fox", "images": [str(path)]} for path in paths]
    prompts.append({"text": "<image>hello world<image>of onnx", "images": [str(paths[0]), str(paths[2])]})
    text_rows, text_mask = left_padded([[1, 40, 41, 42, 43, 44, 45], [46, 47, 48]])
    prompts.append({"inputs": tensor_specs({"input_ids": torch.tensor(text_rows[:1]), "attention_mask": torch.tensor(text_mask[:1])})})
    prompts.append({"inputs": tensor_specs({"input_ids": torch.tensor(text_rows), "attention_mask": torch.tensor(text_mask)})})
    prompts.append({"inputs": tensor_specs(lfm2_vl_padded_batch(model))})
    job = {"folder": str(out), "task": "image-text-to-text", "image_text": {"prompts": prompts, "new_tokens": NEW_TOKENS}}
    results = run_in_transformers_js(transformers_js, tmp_path, job)["image_text"]
    shapes = [result["processed"]["spatial_shapes"]["data"] for result in results[:4]]
    assert shapes == [sum(grids, []) for grids in LFM2_VL_IMAGES.values()] + [[6, 8, 4, 6]]
    expected = [generated_by_transformers(model, from_specs(result["processed"])) for result in results]
    generated = [result["generated"] if len(result["generated_rows"]) == 1 else result["generated_rows"] for result in results]
    assert generated[:-1] == expected[:-1] and len({tuple(tokens) for tokens in expected[:4]}) == 4
    assert padded_batch_tokens(generated[-1]) == padded_batch_tokens(expected[-1])
    inputs = ("pixel_values", "pixel_attention_mask", "spatial_shapes")
    assert padded_batch_in_onnxruntime(out, model, from_specs(prompts[-1]["inputs"]), inputs) == expected[-1]


LFM3_VL_SPECIAL = ["<|image|>", "<|video|>", "<|vision_start|>", "<|vision_end|>"]


def save_lfm3_vl(folder):
    """A three-layer LFM3-VL (a three-layer vision tower, convolution, attention, convolution, of 14-pixel
    patches; an LFM3 text model of a convolution, a sliding-window layer of a window of 8 and a full-attention
    layer) with the Qwen image processor transformers gives it."""
    tokenizer = trained_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": LFM3_VL_SPECIAL})
    ids = [tokenizer.convert_tokens_to_ids(token) for token in LFM3_VL_SPECIAL]
    text = dict(model_type="lfm3", vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, conv_L_cache=3, sliding_window=8,
                layer_types=["conv", "sliding_attention", "full_attention"], pad_token_id=0, bos_token_id=1, eos_token_id=2)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2, layer_types=["conv", "full_attention", "conv"])
    config = transformers.Lfm3VlConfig(text_config=text, vision_config=vision, projector_hidden_size=48, image_token_id=ids[0],
                                       video_token_id=ids[1], vision_start_token_id=ids[2], vision_end_token_id=ids[3])
    torch.manual_seed(0)
    model = transformers.Lfm3VlForConditionalGeneration(config).eval()
    spread_weights(model)  # the tokens then depend on the image
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    transformers.Qwen2VLImageProcessorPil(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64, patch_size=14, merge_size=2,
                                          temporal_patch_size=2).save_pretrained(folder)
    return model


def lfm3_vl_prompt(model, image_processor, images: list, text: list[int]) -> dict[str, torch.Tensor]:
    """``images``' processed patches and grids, each image's tokens (one per merged block) after ``text``."""
    image_id, merge = model.config.image_token_id, model.config.vision_config.spatial_merge_size
    processed = image_processor(images=images, return_tensors="pt")
    tokens = [image_id] * int(processed["image_grid_thw"].prod(-1).sum() // merge ** 2)
    ids = torch.tensor([text + tokens + [50, 51]])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": processed["pixel_values"],
            "image_grid_thw": processed["image_grid_thw"]}


def test_lfm3_vl_folder_in_transformers_js(tmp_path, transformers_js):
    """LFM3-VL as `--runtime standard` writes it for Transformers.js (a vision_encoder over a prompt's patches and
    grids, its convolutions over each frame's grid computed from the grid in the graph, 1-D positions, the LFM3
    states as past_conv.<layer> with a sliding-window layer that the prompts pass): export-hf's verification and
    16 greedy tokens in Transformers.js equal transformers' on transformers' processed inputs: a 45x75 and a 130x60
    image (other grids than the export's) each alone and both in one prompt, a prompt without images, and
    left-padded batches: of text (exact) and with images (padded_batch_tokens; all 16 tokens in onnxruntime with
    transformers' mask and positions); and through the folder's processor
    on a 56x84 image, which it does not resize (its ids and patches equal transformers')."""
    source, out = tmp_path / "source", tmp_path / "out"
    model = save_lfm3_vl(source)
    written_and_verified(source, out, model)
    decoder = onnx.load(out / "onnx" / "decoder_model_merged.onnx", load_external_data=False)
    assert {"past_conv.0", "past_key_values.1.key", "past_key_values.2.key"} <= {value.name for value in decoder.graph.input}
    image_processor = transformers.AutoImageProcessor.from_pretrained(source)
    images = [random_image(45, 75, 0), random_image(130, 60, 1)]
    given = [lfm3_vl_prompt(model, image_processor, chosen, [1, 40, 41]) for chosen in ([images[0]], [images[1]], images)]
    text_rows, text_mask = left_padded([[1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49], [46, 47, 48]])
    given.append({"input_ids": torch.tensor(text_rows[:1]), "attention_mask": torch.tensor(text_mask[:1])})
    given.append({"input_ids": torch.tensor(text_rows), "attention_mask": torch.tensor(text_mask)})
    # the taller image's prompt first, unpadded; the other's padded
    first, second = (lfm3_vl_prompt(model, image_processor, [image], text) for image, text in zip(images[::-1], ([1, 40, 41], [42])))
    rows, mask = left_padded([first["input_ids"][0].tolist(), second["input_ids"][0].tolist()])
    given.append({"input_ids": torch.tensor(rows), "attention_mask": torch.tensor(mask),
                  "pixel_values": torch.cat([first["pixel_values"], second["pixel_values"]]),
                  "image_grid_thw": torch.cat([first["image_grid_thw"], second["image_grid_thw"]])})
    assert given[0]["input_ids"].shape[1] > 8 and mask[1][0] == 0  # a prompt past the sliding window; the batch padded
    prompts = [{"inputs": tensor_specs(inputs)} for inputs in given]
    # through the folder's processor (Lfm3VlProcessor, named in preprocessor_config.json): an image it does not resize
    path = tmp_path / "56x84.png"
    random_image(56, 84, 2).save(path)
    prompts.append({"text": "<|image|>the quick brown fox", "images": [str(path)]})
    job = {"folder": str(out), "task": "image-text-to-text", "image_text": {"prompts": prompts, "new_tokens": NEW_TOKENS}}
    results = run_in_transformers_js(transformers_js, tmp_path, job)["image_text"]
    own = from_specs(results[-1]["processed"])
    processed = image_processor(images=[random_image(56, 84, 2)], return_tensors="pt")
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    assert own["input_ids"][0].tolist() == tokenizer("<|image|>" * 6 + "the quick brown fox")["input_ids"]
    torch.testing.assert_close(own["pixel_values"], processed["pixel_values"], rtol=0, atol=1e-5)
    assert own["image_grid_thw"].tolist() == processed["image_grid_thw"].tolist() == [[1, 4, 6]]
    given.append(own)
    expected = [generated_by_transformers(model, inputs) for inputs in given]
    generated = [result["generated"] if len(result["generated_rows"]) == 1 else result["generated_rows"] for result in results]
    assert generated[:5] == expected[:5] and generated[6] == expected[6]
    assert len({tuple(tokens) for tokens in expected[:3]}) == 3
    assert padded_batch_tokens(generated[5]) == padded_batch_tokens(expected[5])
    assert padded_batch_in_onnxruntime(out, model, given[5], ("pixel_values", "image_grid_thw")) == expected[5]


def test_float16_whisper_folder_in_transformers_js(tmp_path, transformers_js):
    """A float16 Whisper folder as `--runtime standard` writes it: its encoder takes the
    log-mel features in float32, as Transformers.js's processor makes them and feeds them
    uncast (a float16 `input_features` stopped the client: "Unexpected input data type"),
    and the client generates transformers' float16 model's tokens."""
    from test_whisper_genai import clips, features_of, save_multilingual_whisper

    save_multilingual_whisper(tmp_path / "source")
    out = tmp_path / "out"
    export_hf(tmp_path / "source", out, runtime="standard", dtype="float16", verify=True)
    encoder = out / "onnx" / "encoder_model_fp16.onnx"
    onnx.checker.check_model(os.fspath(encoder), full_check=True)
    inputs = {i.name: i.type.tensor_type.elem_type for i in onnx.load(os.fspath(encoder), load_external_data=False).graph.input}
    assert inputs["input_features"] == onnx.TensorProto.FLOAT
    samples = list(clips().values())
    options = {"language": "en", "task": "transcribe", "max_new_tokens": NEW_TOKENS}
    job = {"folder": str(out), "task": "automatic-speech-recognition",
           "speech": {"clips": [(clip.astype(np.float32) / 32768).tolist() for clip in samples], "options": options}}
    result = run_in_transformers_js(transformers_js, tmp_path, job)["speech"]
    model = transformers.WhisperForConditionalGeneration.from_pretrained(tmp_path / "source", dtype=torch.float16).eval()
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(tmp_path / "source")
    for clip, generated in zip(samples, result["generated"]):
        with torch.no_grad():
            expected = model.generate(features_of(extractor, clip).half(), language="en", task="transcribe",
                                      max_new_tokens=NEW_TOKENS)[0].tolist()
        assert len(expected) == NEW_TOKENS and generated == expected
