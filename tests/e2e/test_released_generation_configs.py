"""Folders of tiny models given the generation config their released checkpoint ships
(tests/released_generation_configs.py), in the clients, against transformers' `generate`.

The folder keeps `generation_config.json` as the source has it. Transformers.js reads it and
applies its logits processors (forced bos and eos tokens, no-repeat n-grams, bad words,
repetition penalty) but runs `num_beams` > 1 as greedy search
(fx2onnx/hub/shared/generation_search.py says where): its 16 tokens are transformers'
`generate` with the config and num_beams=1, which export-hf says. It samples without top_p: Qwen2-VL's
config (top_k 1) gives transformers' tokens as written; Gemma 3's is compared greedily, and its sampling
checked for where it stops. ONNX Runtime GenAI reads the
config's sampling and repetition settings from genai_config.json's search section: with
do_sample off, its tokens are transformers' with do_sample=False (the repetition penalty kept).
"""

from __future__ import annotations

import json
import os

import onnx
import pytest
import torch

from fx2onnx.hub import export_hf
from released_generation_configs import released
from test_transformers_js import NEW_TOKENS, PROMPTS, run_in_transformers_js, spread_weights, tensor_specs, trained_tokenizer
from test_transformers_js import transformers_js  # noqa: F401 - the session fixture

transformers = pytest.importorskip("transformers")

# the tiny tokenizer's ids: <pad> 0, <s> 1, </s> 2; each family's released ids by role mapped onto them
_BART_IDS = {0: 1, 1: 0, 2: 2}  # <s> 0, <pad> 1, </s> 2
_SIZES = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
              encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)
TEXT2TEXT = {
    "bart": (transformers.BartConfig, transformers.BartForConditionalGeneration, _BART_IDS, _SIZES),
    "marian": (transformers.MarianConfig, transformers.MarianMTModel, {0: 2, 58100: 0}, _SIZES),
}
# mBART-50's and M2M100's configs (beams 5, early_stopping, mBART's forced eos) ask for nothing BART's and Marian's do
# not; T5's, ids only, is its greedy folder's (test_transformers_js.py): their notes in tests/unit/hub/test_generation_search.py


def generated(model, given: dict, **search) -> list[list[int]]:
    """transformers' 16 new tokens with the model's generation config and ``search`` over it."""
    with torch.no_grad():
        out = model.generate(**given, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, **search)
    return out.tolist()


def assert_processors_applied(tokens: list[int], config: dict, start: list[int]) -> None:
    """The config's logits processors show in ``tokens`` (after the decoder's ``start``)."""
    if "forced_bos_token_id" in config:
        assert tokens[0] == config["forced_bos_token_id"]
    if "forced_eos_token_id" in config:
        assert tokens[-1] == config["forced_eos_token_id"]
    for word in config.get("bad_words_ids", []):
        assert word[0] not in tokens
    if size := config.get("no_repeat_ngram_size"):
        sequence = start + tokens
        grams = [tuple(sequence[i:i + size]) for i in range(len(sequence) - size + 1)]
        assert len(set(grams)) == len(grams)


@pytest.mark.parametrize("family", list(TEXT2TEXT))
def test_text2text_folder_with_its_released_generation_config_in_transformers_js(tmp_path, transformers_js, family):
    """BART and Marian with their released generation configs: the folder's
    generation_config.json is the source's, export-hf says Transformers.js runs the beams greedily
    (and --verify that it decodes greedily without the config's search),
    and Transformers.js's 16 tokens are transformers' `generate` with the config at num_beams=1,
    its processors applied (forced tokens, bad words, no repeated 3-grams)."""
    config_class, model_class, ids, sizes = TEXT2TEXT[family]
    tokenizer = trained_tokenizer()
    generation = released(family, ids)
    roles = {k: generation[k] for k in ("pad_token_id", "eos_token_id", "decoder_start_token_id")}
    torch.manual_seed(0)
    model = model_class(config_class(vocab_size=len(tokenizer), **sizes, **roles)).eval()
    spread_weights(model)  # tokens that vary (at the initial weights one token repeats)
    model.generation_config = transformers.GenerationConfig(**generation)
    source, out = tmp_path / "source", tmp_path / "out"
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    # as saved: Marian's sinusoidal positions are computed again on loading, not read
    model = model_class.from_pretrained(source).eval()
    said = []
    assert export_hf(source, out, verify=True, say=said.append).verification.passed
    assert any(line.startswith("verification decoded greedily without the search of generation_config.json (num_beams 4")
               for line in said)
    onnx.checker.check_model(os.fspath(out / "onnx" / "decoder_model_merged.onnx"), full_check=True)
    assert json.loads((out / "generation_config.json").read_text()) == json.loads((source / "generation_config.json").read_text())
    beams = [line for line in said if "runs as greedy search" in line]
    assert len(beams) == (1 if generation.get("num_beams", 1) > 1 else 0)

    prompts = [list(tokenizer(text)["input_ids"]) for text in PROMPTS]
    job = {"folder": str(out), "task": "text2text-generation", "prompts": prompts, "new_tokens": NEW_TOKENS}
    result = run_in_transformers_js(transformers_js, tmp_path, job)["generated"]
    start = [generation["decoder_start_token_id"]]
    for prompt, tokens in zip(prompts, result):
        given = {"input_ids": torch.tensor([prompt]), "attention_mask": torch.ones(1, len(prompt), dtype=torch.int64)}
        expected = generated(model, given, num_beams=1, do_sample=False)[0]
        assert expected[:1] == start and tokens == expected[1:]
        assert_processors_applied(tokens, generation, start)
    # Marian's tiny decoder repeats its first token at every weight scale tried (0.3 to 1)
    assert len({t for tokens in result for t in tokens}) > (1 if family == "marian" else 3)


def test_florence2_folder_with_its_released_generation_config_in_transformers_js(tmp_path, transformers_js):
    """Florence-2 with its released generation config (beams 3, no_repeat_ngram_size 3, forced bos
    0 and eos 2): the folder keeps it, and Transformers.js's 16 tokens on an image and a task
    prompt are transformers' `generate` with it at num_beams=1 (the no-repeat and forced tokens
    applied)."""
    from fx2onnx.hub.vision_language.florence2_verify import random_image, transformers_js_inputs
    from test_transformers_js import save_florence2

    model, processor = save_florence2(tmp_path / "source")
    # the released ids by role: <s> 0, <pad> 1, </s> 2 in the checkpoint; <pad> 0, <s> 1, </s> 2 here
    generation = released("florence2", _BART_IDS)
    model.generation_config = transformers.GenerationConfig(**generation)
    model.generation_config.save_pretrained(tmp_path / "source")
    said = []
    export_hf(tmp_path / "source", tmp_path / "out", task="image-text-to-text", runtime="standard", say=said.append)
    assert json.loads((tmp_path / "out" / "generation_config.json").read_text()) == {
        **generation, "transformers_version": transformers.__version__}
    assert any("num_beams 3 runs as greedy search" in line for line in said)
    prompts, expected = [], []
    for task, picture in (("<CAPTION>", random_image(50, 70, 0)), ("<OD>", random_image(90, 40, 1))):
        given = dict(processor(text=task, images=picture, return_tensors="pt"))
        prompts.append({"inputs": tensor_specs({k: torch.from_numpy(v) for k, v in
                                                transformers_js_inputs(given, int(model.config.image_token_id)).items()})})
        expected.append(generated(model, given, num_beams=1, do_sample=False)[0][1:])
    job = {"folder": str(tmp_path / "out"), "task": "image-text-to-text",
           "image_text": {"prompts": prompts, "new_tokens": NEW_TOKENS}}
    results = run_in_transformers_js(transformers_js, tmp_path, job)["image_text"]
    assert [result["generated"] for result in results] == expected and expected[0] != expected[1]
    for tokens in expected:
        assert_processors_applied(tokens, generation, [generation["decoder_start_token_id"]])


def test_qwen2_5_vl_genai_folder_searches_as_its_released_generation_config(tmp_path):
    """Qwen2.5-VL's GenAI folder with Qwen's released generation config (sampling at top_k 1,
    top_p 0.001, temperature 0.1; repetition_penalty 1.05; two eos ids): genai_config.json's
    search and ids say so, and ONNX Runtime GenAI with do_sample off (its own processor on two
    images of other sizes) gives transformers' 16 tokens with do_sample=False, the repetition
    penalty applied by both."""
    from PIL import Image
    import numpy as np
    import test_export_hf_vision_language as vision_tests

    source, out = tmp_path / "source", tmp_path / "out"
    model = vision_tests.save_qwen2_5_vl(source)
    # the released ids by role: <|endoftext|> 151643, <|im_end|> 151645, <|vision_pad|> 151654 (not in the tiny vocabulary:
    # <|endoftext|>, the other pad)
    generation = released("qwen2_vl", {151643: 0, 151645: 2, 151654: 0})
    model.generation_config = transformers.GenerationConfig(**generation)
    model.generation_config.save_pretrained(source)
    export_hf(source, out)
    written = json.loads((out / "genai_config.json").read_text())
    assert {k: written["search"][k] for k in ("do_sample", "top_k", "top_p", "temperature", "repetition_penalty")} == {
        "do_sample": True, "top_k": 1, "top_p": 0.001, "temperature": 0.1, "repetition_penalty": 1.05}
    assert (written["model"]["eos_token_id"], written["model"]["pad_token_id"]) == ([2, 0], 0)
    paths = []
    for seed, size in enumerate(((45, 75), (130, 60))):
        paths.append(tmp_path / f"{seed}.png")
        Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)).save(paths[-1])
    expected = vision_tests.transformers_tokens(source, model, paths, NEW_TOKENS)
    assert vision_tests.genai_tokens(out, paths, NEW_TOKENS) == expected
    # a penalty that changes this model's tokens, read from the search section as written: the runtime
    # penalizes the prompt's tokens (image tokens included) as transformers does
    written["search"]["repetition_penalty"] = model.generation_config.repetition_penalty = 1.5
    (out / "genai_config.json").write_text(json.dumps(written))
    penalized = vision_tests.transformers_tokens(source, model, paths, NEW_TOKENS)
    assert penalized != expected and vision_tests.genai_tokens(out, paths, NEW_TOKENS) == penalized


def test_causal_lm_genai_folder_runs_the_generation_configs_beam_search(tmp_path):
    """A generation config of beam search with no repeated 3-grams: genai_config.json's search
    carries it, export-hf says how the runtime's beam search differs, and ONNX Runtime GenAI
    running the search as written (16 tokens at least) gives transformers' `generate`; 2 beams
    and greedy search too. (At 4 beams the runtime returns a lower-scoring beam than
    transformers' on this model, with a standard-operator graph as with this one: its search.)"""
    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai does not install on this platform")
    from test_export_hf import save_causal_lm

    tokenizer = trained_tokenizer()
    model = save_causal_lm(tmp_path / "source", "llama", tokenizer)
    spread_weights(model)
    model.generation_config = transformers.GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, num_beams=3,
                                                            no_repeat_ngram_size=3, early_stopping=True)
    model.save_pretrained(tmp_path / "source")
    said = []
    export_hf(tmp_path / "source", tmp_path / "out", say=said.append)
    search = json.loads((tmp_path / "out" / "genai_config.json").read_text())["search"]
    assert (search["num_beams"], search["no_repeat_ngram_size"], search["early_stopping"]) == (3, 3, True)
    assert any(line.startswith("ONNX Runtime GenAI") and "beam search (num_beams 3)" in line for line in said)
    runtime = og.Model(str(tmp_path / "out"))
    prompt = list(tokenizer(PROMPTS[0])["input_ids"])
    for beams in (3, 2, 1):
        params = og.GeneratorParams(runtime)
        params.set_search_options(max_length=len(prompt) + NEW_TOKENS, min_length=len(prompt) + NEW_TOKENS,
                                  **({} if beams == 3 else {"num_beams": beams}))
        generator = og.Generator(runtime, params)
        generator.append_tokens([prompt])
        while not generator.is_done():
            generator.generate_next_token()
        tokens = [int(t) for t in generator.get_sequence(0)][len(prompt):]
        given = {"input_ids": torch.tensor([prompt]), "attention_mask": torch.ones(1, len(prompt), dtype=torch.int64)}
        assert tokens == generated(model, given, num_beams=beams)[0][len(prompt):], beams


def test_qwen2_vl_folder_samples_its_released_generation_config_in_transformers_js(tmp_path, transformers_js):
    """Qwen2-VL with Qwen's released generation config run as written by Transformers.js (sampling at
    top_k 1: the argmax after the repetition penalty 1.05 and temperature 0.1; top_p not applied, which at
    top_k 1 changes nothing): its 16 tokens on an image are transformers' `generate` with the same config, and
with a repetition penalty of 1.5 given to both (the rest as written), which changes them."""
    import qwen3_kind_models
    from test_transformers_js import random_image, save_qwen2_vl

    source, out = tmp_path / "source", tmp_path / "out"
    model = save_qwen2_vl(source)
    # the released ids by role, as the GenAI test above maps them
    generation = released("qwen2_vl", {151643: 0, 151645: 2, 151654: 0})
    model.generation_config = transformers.GenerationConfig(**generation)
    model.generation_config.save_pretrained(source)
    export_hf(source, out, runtime="standard")
    assert json.loads((out / "generation_config.json").read_text())["top_k"] == 1
    random_image(45, 75, 0).save(tmp_path / "image.png")
    given = qwen3_kind_models.processed_batch(source, "qwen2_vl", [([tmp_path / "image.png"], "describe this image")], 0)
    # as written, and with a penalty that changes this model's tokens (1.05 does not), the rest as written
    searches = [{"min_new_tokens": NEW_TOKENS}, {"min_new_tokens": NEW_TOKENS, "repetition_penalty": 1.5}]
    job = {"folder": str(out), "task": "image-text-to-text",
           "image_text": {"prompts": [{"inputs": tensor_specs(given), "options": search} for search in searches],
                          "new_tokens": NEW_TOKENS}}
    results = [result["generated"] for result in run_in_transformers_js(transformers_js, tmp_path, job)["image_text"]]
    given["mm_token_type_ids"] = (given["input_ids"] == model.config.image_token_id).long()
    length = given["input_ids"].shape[1]
    sampled = generated(model, given)[0][length:]
    penalized = generated(model, given, repetition_penalty=1.5)[0][length:]
    assert model.generation_config.do_sample and results == [sampled, penalized] and sampled != penalized


def test_gemma3_folder_with_its_released_generation_config_in_transformers_js(tmp_path, transformers_js):
    """Gemma 3 with Google's released generation config (sampling at top_k 64, top_p 0.95; eos 1 and
    106): with do_sample false given to both clients (the rest of the config as written, no minimum
    length) Transformers.js's tokens on an image are transformers'; eos ids given as a list stop both
    at whichever comes first; sampling as written stops at an eos id or after 16 tokens, each a
    token of the vocabulary."""
    from test_transformers_js import random_image, save_gemma3
    from test_export_hf_vision_language import gemma_prompt

    source, out = tmp_path / "source", tmp_path / "out"
    model = save_gemma3(source)
    processor = transformers.AutoProcessor.from_pretrained(source)
    token = processor.tokenizer.convert_tokens_to_ids
    # the released ids by role: <pad> 0, <eos> 1, <bos> 2, <end_of_turn> 106
    generation = released("gemma3", {0: token("<pad>"), 1: token("<eos>"), 2: token("<bos>"), 106: token("<end_of_turn>")})
    model.generation_config = transformers.GenerationConfig(**generation)
    model.generation_config.save_pretrained(source)
    export_hf(source, out, runtime="standard")
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == generation["eos_token_id"]
    given = dict(processor(text=gemma_prompt(1), images=[random_image(64, 64, 0)], return_tensors="pt"))
    length = given["input_ids"].shape[1]
    with torch.no_grad():
        greedy = model.generate(**given, max_new_tokens=NEW_TOKENS, do_sample=False)[0, length:].tolist()
    # eos ids a list of two tokens greedy search gives, each first at its place: either stops both clients
    first, later = greedy[2], next(t for t in greedy[5:] if t not in greedy[:5])
    stops = [[later, first], [first, later]]
    client = tensor_specs({k: given[k] for k in ("input_ids", "attention_mask", "pixel_values")})
    prompts = [{"inputs": client, "options": {"do_sample": False}}]
    prompts += [{"inputs": client, "options": {"do_sample": False, "eos_token_id": eos}} for eos in stops]
    prompts += [{"inputs": client, "options": {}}] * 4  # sampling as written
    job = {"folder": str(out), "task": "image-text-to-text", "image_text": {"prompts": prompts, "new_tokens": NEW_TOKENS}}
    results = [result["generated"] for result in run_in_transformers_js(transformers_js, tmp_path, job)["image_text"]]
    assert results[0] == greedy
    for eos, tokens in zip(stops, results[1:3]):
        with torch.no_grad():
            expected = model.generate(**given, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=eos)[0, length:]
        assert tokens == expected.tolist() == greedy[:3]
    vocabulary = model.config.text_config.vocab_size
    for tokens in results[3:]:
        assert 0 < len(tokens) <= NEW_TOKENS and all(0 <= t < vocabulary for t in tokens)
        ends = [i for i, t in enumerate(tokens) if t in generation["eos_token_id"]]
        assert ends in ([], [len(tokens) - 1]) and (ends or len(tokens) == NEW_TOKENS)
