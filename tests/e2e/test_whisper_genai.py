"""`export-hf` of Whisper for ONNX Runtime GenAI (`--runtime onnxruntime`, the default):
a tiny random Whisper (2 + 2 layers) with its feature extractor and a tokenizer trained
here, exported, checked, and transcribing a generated .wav in the runtime as
`model.generate` does on transformers' features."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import onnx
import onnxruntime
import pytest
import tokenizers
import torch
import transformers

from fx2onnx.hub import export_hf
from fx2onnx.hub.shared.verification import tolerance_for
from fx2onnx.hub.whisper.whisper_config import beam_search_note, whisper_genai_config
from fx2onnx.hub.whisper.whisper_verify import speech_signal, verify_whisper_genai, write_wav

SPECIAL = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|fr|>", "<|translate|>", "<|transcribe|>", "<|startoflm|>",
           "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>"]
PROMPT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
LAYERS, HEADS, HEAD_SIZE, MEL_BINS = 2, 4, 16, 80


def byte_level_whisper_tokenizer() -> transformers.WhisperTokenizer:
    """A WhisperTokenizer over a byte-level BPE trained here (no special tokens yet)."""
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(["the quick brown fox jumps over the lazy dog, hello world"] * 20, tokenizers.trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    model_json = json.loads(bpe.to_str())["model"]
    return transformers.WhisperTokenizer(vocab=model_json["vocab"], merges=[tuple(m) if isinstance(m, list) else tuple(m.split())
                                                                             for m in model_json["merges"]])


def save_whisper(folder, sampling_rate: int = 16000) -> None:
    """A random Whisper, its feature extractor and a byte-level BPE WhisperTokenizer with
    Whisper's special tokens."""
    tokenizer = byte_level_whisper_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL[1:]})
    ids = dict(zip(SPECIAL, tokenizer.convert_tokens_to_ids(SPECIAL)))
    config = transformers.WhisperConfig(
        vocab_size=len(tokenizer), d_model=HEADS * HEAD_SIZE, encoder_layers=LAYERS, decoder_layers=LAYERS,
        encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=128, decoder_ffn_dim=128,
        num_mel_bins=MEL_BINS, max_source_positions=1500, max_target_positions=64,
        decoder_start_token_id=ids["<|startoftranscript|>"], bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|endoftext|>"], pad_token_id=ids["<|endoftext|>"], begin_suppress_tokens=[], suppress_tokens=[],
        init_std=0.2,  # weights large enough that the greedy tokens depend on the audio
    )
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    transformers.WhisperFeatureExtractor(feature_size=MEL_BINS, sampling_rate=sampling_rate, hop_length=160, chunk_length=30,
                                         n_fft=400).save_pretrained(folder)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("whisper")
    save_whisper(root / "source")
    result = export_hf(root / "source", root / "out", verify=True, tokens=12)
    return root, result


def dims(path, name):
    model = onnx.load(os.fspath(path), load_external_data=False)
    value = next(v for v in [*model.graph.input, *model.graph.output] if v.name == name)
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def test_folder_layout_and_configs(exported):
    root, result = exported
    out = root / "out"
    assert result.task == "automatic-speech-recognition"
    assert set(result.files) >= {"onnx/encoder.onnx", "onnx/encoder.onnx_data", "onnx/decoder.onnx", "onnx/decoder.onnx_data",
                                 "genai_config.json", "audio_processor_config.json", "tokenizer.json", "tokenizer_config.json"}
    encoder, decoder = out / "onnx" / "encoder.onnx", out / "onnx" / "decoder.onnx"
    for path in (encoder, decoder):
        onnx.checker.check_model(os.fspath(path), full_check=True)
    assert dims(encoder, "audio_features") == ["batch_size", MEL_BINS, 3000]
    assert dims(encoder, "encoder_hidden_states") == ["batch_size", 1500, HEADS * HEAD_SIZE]
    assert dims(encoder, f"present_value_cross_{LAYERS - 1}") == ["batch_size", HEADS, 1500, HEAD_SIZE]
    assert [i.name for i in onnx.load(os.fspath(decoder), load_external_data=False).graph.input] == [
        "input_ids", "past_key_self_0", "past_value_self_0", "past_key_self_1", "past_value_self_1",
        "past_key_cross_0", "past_value_cross_0", "past_key_cross_1", "past_value_cross_1",
    ]  # no encoder_hidden_states: the runtime then feeds the encoder's cross caches
    assert dims(decoder, "past_key_self_0") == ["batch_size", HEADS, "past_sequence_length", HEAD_SIZE]
    assert dims(decoder, "present_value_self_1") == ["batch_size", HEADS, "total_sequence_length", HEAD_SIZE]
    assert dims(decoder, "logits")[:2] == ["batch_size", "sequence_length"]
    genai = json.loads((out / "genai_config.json").read_text())
    model = genai["model"]
    assert model["type"] == "whisper" and model["encoder"]["filename"] == "onnx/encoder.onnx"
    assert model["decoder"]["inputs"]["cross_past_key_names"] == "past_key_cross_%d"
    assert model["encoder"]["outputs"]["cross_present_value_names"] == "present_value_cross_%d"
    assert (model["decoder"]["num_hidden_layers"], model["decoder"]["head_size"]) == (LAYERS, HEAD_SIZE)
    steps = [step["operation"] for step in json.loads((out / "audio_processor_config.json").read_text())["feature_extraction"]["sequence"]]
    assert [s["type"] for s in steps] == ["AudioDecoder", "STFTNorm", "LogMelSpectrum"]
    assert steps[2]["attrs"] == {"chunk_size": 30, "hop_length": 160, "n_fft": 400, "n_mel": MEL_BINS}
    # --verify: the two models in onnxruntime on transformers' features, greedy, against the model
    verification = result.verification
    assert verification.passed and verification.max_logit_difference < 1e-4
    assert verification.onnx_tokens == verification.torch_tokens and len(verification.torch_tokens) == 12


def test_runtime_transcribes_as_transformers(exported):
    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai does not install on this platform")
    root, result = exported
    # --verify ran the runtime too when it is installed: the same tokens, from its own log-mel features
    assert result.verification.genai_tokens == result.verification.torch_tokens
    assert result.verification.feature_difference < 1e-3
    # as a user runs the folder: a .wav, the multimodal processor, the generator
    samples = speech_signal(16000, seconds=5.0)
    write_wav(root / "speech.wav", samples, 16000)
    model = og.Model(str(root / "out"))
    processor = model.create_multimodal_processor()
    inputs = processor([PROMPT], audios=og.Audios.open(str(root / "speech.wav")))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=4 + 16, batch_size=1)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    while not generator.is_done():
        generator.generate_next_token()
    genai_tokens = [int(t) for t in generator.get_sequence(0)]
    source = root / "source"
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    prompt = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    features = transformers.WhisperFeatureExtractor.from_pretrained(source)(
        samples.astype(np.float32) / 32768, sampling_rate=16000, return_tensors="pt").input_features
    reference = transformers.WhisperForConditionalGeneration.from_pretrained(source).eval()
    with torch.no_grad():
        generated = reference.generate(features, decoder_input_ids=torch.tensor([prompt]), do_sample=False, max_new_tokens=16)
    assert genai_tokens[:4] == prompt and genai_tokens[4:] == generated[0].tolist()
    # the transcription depends on the audio: --verify's 3 s signal gave other tokens
    assert genai_tokens[4:16] != result.verification.torch_tokens


def test_feature_extractor_the_runtime_cannot_follow_is_refused(tmp_path):
    save_whisper(tmp_path / "source", sampling_rate=8000)
    with pytest.raises(ValueError, match="sampling_rate is 8000 Hz.*--runtime standard"):
        export_hf(tmp_path / "source", tmp_path / "out")
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_verify_sees_an_error_in_the_decoder(exported, tmp_path):
    """1e-2 added to the decoder's logits: the verification fails on the logits' difference
    (a constant added to every logit keeps the greedy tokens)."""
    root, _ = exported
    folder = tmp_path / "out"
    shutil.copytree(root / "out", folder)
    path = folder / "onnx" / "decoder.onnx"
    model = onnx.load(os.fspath(path), load_external_data=False)
    for node in model.graph.node:
        node.output[:] = ["logits.clean" if name == "logits" else name for name in node.output]
    model.graph.initializer.append(onnx.helper.make_tensor("planted", onnx.TensorProto.FLOAT, [], [1e-2]))
    model.graph.node.append(onnx.helper.make_node("Add", ["logits.clean", "planted"], ["logits"]))
    onnx.save(model, os.fspath(path))
    reference = transformers.WhisperForConditionalGeneration.from_pretrained(root / "source").eval()
    verification = verify_whisper_genai(folder, folder / "onnx" / "encoder.onnx", path, reference, root / "source", 4,
                                        tolerance_for(torch.float32))
    assert not verification.passed and verification.tokens_equal
    assert verification.max_logit_difference == pytest.approx(1e-2, rel=1e-3)
    assert "greedy tokens equal" in verification.summary()


# --- the generation config of a released multilingual checkpoint (large-v3's layout) ---

MULTILINGUAL_MEL_BINS = 128
# byte-level symbols that released checkpoints list in suppress_tokens (those this tokenizer has)
SUPPRESSED_SYMBOLS = ['"', "#", "(", ")", "*", "+", "/", ":", ";", "<", "=", ">", "@", "[", "\\", "]", "^", "_", "`", "{", "|", "}",
                      "~", "Ġ-", 'Ġ"', "Ġ("]
TASKS = ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>"]


def multilingual_tokenizer() -> transformers.WhisperTokenizer:
    """Whisper's special tokens as a multilingual checkpoint has them: every language of
    transformers' Whisper tokenizer, the tasks, <|notimestamps|>, then the 1501 timestamps."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    tokenizer = byte_level_whisper_tokenizer()
    languages = [f"<|{code}|>" for code in LANGUAGES]
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|startoftranscript|>", *languages, *TASKS, "<|notimestamps|>"]})
    tokenizer.add_tokens([f"<|{0.02 * index:.2f}|>" for index in range(1501)])
    return tokenizer


def released_generation_config(tokenizer, suppress: bool) -> transformers.GenerationConfig:
    """generation_config.json as released checkpoints ship it: languages and tasks, and the
    suppress lists (symbols and special tokens always, a space and end of text at the first
    step), or without the lists."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    ids = tokenizer.convert_tokens_to_ids
    eot, start = ids("<|endoftext|>"), ids("<|startoftranscript|>")
    symbols = [s for s in SUPPRESSED_SYMBOLS if s in tokenizer.get_vocab()]
    languages = [f"<|{code}|>" for code in LANGUAGES]
    return transformers.GenerationConfig(
        decoder_start_token_id=start, bos_token_id=eot, eos_token_id=eot, pad_token_id=eot, max_length=64,
        is_multilingual=True, lang_to_id=dict(zip(languages, ids(languages))),
        task_to_id={"transcribe": ids("<|transcribe|>"), "translate": ids("<|translate|>")},
        no_timestamps_token_id=ids("<|notimestamps|>"), prev_sot_token_id=ids("<|startofprev|>"), max_initial_timestamp_index=50,
        suppress_tokens=[*ids(symbols), start, *ids(TASKS)] if suppress else None,
        begin_suppress_tokens=[ids("Ġ"), eot] if suppress else None,
    )


def loud_clip(rate: int = 16000, seconds: float = 4.0) -> np.ndarray:
    """Loud from the first sample to the last (no silence at either end), 16-bit."""
    t = np.arange(int(rate * seconds)) / rate
    signal = 0.6 * np.sin(2 * np.pi * 300 * t) + 0.3 * np.sign(np.sin(2 * np.pi * 3 * t))
    return np.round(signal * 0.9 * 32767).astype(np.int16)


def clips() -> dict[str, np.ndarray]:
    return {"padded with silence": speech_signal(16000, seconds=5.0), "loud at both ends": loud_clip()}


def features_of(extractor, samples: np.ndarray) -> torch.Tensor:
    return extractor(samples.astype(np.float32) / 32768, sampling_rate=16000, return_tensors="pt").input_features


def first_pick_logits(model, features: torch.Tensor, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_features=features, decoder_input_ids=torch.tensor([prompt])).logits[0, -1]


def force_suppressed_first_picks(model, tokenizer, extractor, prompt: list[int], timestamp_scale: float) -> None:
    """Relabel tokens (swap rows of the tied embedding) so that on each clip the model's
    first pick is a begin-suppressed token (a space on one clip, end of text on the other)
    and its second choice an always-suppressed symbol: the suppress lists decide the first
    generated token. Timestamps get smaller embeddings, as after <|notimestamps|> in a
    trained model (two timestamps in a row would make generate decode the audio again)."""
    ids = tokenizer.convert_tokens_to_ids
    embedding = model.get_decoder().embed_tokens.weight
    with torch.no_grad():
        embedding[ids("<|notimestamps|>") + 1:] *= timestamp_scale
    targets = [ids("Ġ"), ids("<|endoftext|>"), ids('"'), ids("#")]
    orders = [[t for t in first_pick_logits(model, features_of(extractor, c), prompt).argsort(descending=True).tolist()
               if t not in prompt and t not in targets] for c in clips().values()]
    sources: list[int] = []
    for clip, rank in ((0, 0), (1, 0), (0, 1), (1, 1)):
        sources.append(next(t for t in orders[clip][rank:] if t not in sources))
    with torch.no_grad():
        rows = embedding.clone()
        for source, target in zip(sources, targets):
            embedding[target], embedding[source] = rows[source], rows[target]


def save_multilingual_whisper(folder, suppress: bool = True, timestamp_scale: float = 0.3) -> None:
    """A random large-v3-style Whisper (128 mel bins, multilingual tokenizer, the released
    generation config) whose first pick on each clip is suppressed; ``timestamp_scale``
    scales the timestamps' embeddings (1: emitted as often as other tokens)."""
    tokenizer = multilingual_tokenizer()
    ids = tokenizer.convert_tokens_to_ids
    eot, start = ids("<|endoftext|>"), ids("<|startoftranscript|>")
    config = transformers.WhisperConfig(
        vocab_size=len(tokenizer), d_model=HEADS * HEAD_SIZE, encoder_layers=LAYERS, decoder_layers=LAYERS,
        encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=128, decoder_ffn_dim=128,
        num_mel_bins=MULTILINGUAL_MEL_BINS, max_source_positions=1500, max_target_positions=64,
        decoder_start_token_id=start, bos_token_id=eot, eos_token_id=eot, pad_token_id=eot, init_std=0.2,
    )
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(config).eval()
    extractor = transformers.WhisperFeatureExtractor(feature_size=MULTILINGUAL_MEL_BINS, sampling_rate=16000, hop_length=160,
                                                     chunk_length=30, n_fft=400)
    force_suppressed_first_picks(model, tokenizer, extractor, ids(["<|startoftranscript|>", "<|en|>", "<|transcribe|>",
                                                                   "<|notimestamps|>"]), timestamp_scale)
    model.generation_config = released_generation_config(tokenizer, suppress)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    extractor.save_pretrained(folder)


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory):
    """The released-style model exported with --verify, and a folder of the same weights
    exported from a generation config without the suppress lists."""
    root = tmp_path_factory.mktemp("whisper-multilingual")
    save_multilingual_whisper(root / "source")
    save_multilingual_whisper(root / "source-without-lists", suppress=False)
    result = export_hf(root / "source", root / "out", verify=True, tokens=16)
    export_hf(root / "source-without-lists", root / "out-without-lists")
    return root, result


def runtime_tokens(folder, wav, new_tokens: int = 16, **search) -> list[int]:
    """The runtime's tokens after the prompt; ``search``: more search options (beam search)."""
    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai does not install on this platform")
    model = og.Model(str(folder))
    inputs = model.create_multimodal_processor()([PROMPT], audios=og.Audios.open(str(wav)))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=4 + new_tokens, batch_size=1, **search)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)][4:]


def test_suppress_lists_decide_the_first_pick(multilingual):
    """The test model is one where the lists matter: on each clip the first pick without them
    is begin-suppressed, and the next choice always suppressed."""
    root, _ = multilingual
    model = transformers.WhisperForConditionalGeneration.from_pretrained(root / "source").eval()
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(root / "source")
    generation = model.generation_config
    assert generation.begin_suppress_tokens and len(generation.suppress_tokens) > 20
    prompt = transformers.AutoTokenizer.from_pretrained(root / "source")(PROMPT, add_special_tokens=False)["input_ids"]
    for samples in clips().values():
        order = first_pick_logits(model, features_of(extractor, samples), prompt).argsort(descending=True).tolist()
        assert order[0] in generation.begin_suppress_tokens
        assert next(t for t in order if t not in generation.begin_suppress_tokens) in generation.suppress_tokens


@pytest.mark.parametrize("clip", list(clips()))
def test_runtime_generates_as_generate_with_language_and_task(multilingual, clip, tmp_path):
    root, _ = multilingual
    samples = clips()[clip]
    write_wav(tmp_path / "clip.wav", samples, 16000)
    model = transformers.WhisperForConditionalGeneration.from_pretrained(root / "source").eval()
    features = features_of(transformers.WhisperFeatureExtractor.from_pretrained(root / "source"), samples)
    with torch.no_grad():
        expected = model.generate(features, language="en", task="transcribe", max_new_tokens=16)[0].tolist()
        unsuppressed = model.generate(features, language="en", task="transcribe", max_new_tokens=16, suppress_tokens=None,
                                      begin_suppress_tokens=None)[0].tolist()
    assert len(expected) == 16
    assert runtime_tokens(root / "out", tmp_path / "clip.wav") == expected
    # the folder exported without the lists decodes as generate without them, another first token
    assert runtime_tokens(root / "out-without-lists", tmp_path / "clip.wav") == unsuppressed[:16]
    assert unsuppressed[:1] != expected[:1]  # on one clip, end of text: nothing transcribed


def without_end_of_text(tokens: list[int], end_of_text: int) -> list[int]:
    """The tokens before end of text: transformers' beam search returns it (then pads with it),
    the runtime's leaves it out."""
    return tokens[:tokens.index(end_of_text)] if end_of_text in tokens else tokens


@pytest.mark.parametrize("beams, early_stopping", [(2, True), (3, False)])
def test_runtime_beam_search_as_generate(multilingual, beams, early_stopping, tmp_path):
    """The runtime's beam search with the suppress lists in the graph, per beam, against
    generate(num_beams=...) with length_penalty 0, where both rank finished beams by their
    sum of log-probabilities; the folder without the lists searches as generate without them."""
    root, _ = multilingual
    model = transformers.WhisperForConditionalGeneration.from_pretrained(root / "source").eval()
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(root / "source")
    end_of_text = model.generation_config.eos_token_id
    search = {"num_beams": beams, "length_penalty": 0.0, "early_stopping": early_stopping}
    differs_from_greedy, differs_without_lists = [], []
    for name, samples in clips().items():
        wav = tmp_path / f"{name}.wav"
        write_wav(wav, samples, 16000)
        with torch.no_grad():
            expected, unsuppressed = (without_end_of_text(model.generate(
                features_of(extractor, samples), language="en", task="transcribe", max_new_tokens=16, **search, **lists)[0].tolist(),
                end_of_text) for lists in ({}, {"suppress_tokens": None, "begin_suppress_tokens": None}))
        assert runtime_tokens(root / "out", wav, **search) == expected
        assert runtime_tokens(root / "out-without-lists", wav, **search) == unsuppressed
        differs_from_greedy.append(expected != runtime_tokens(root / "out", wav))
        differs_without_lists.append(unsuppressed != expected)
    assert all(differs_from_greedy) and any(differs_without_lists)


def test_runtime_beam_search_to_max_length_as_generate(exported, tmp_path):
    """Beams that run to the length limit (no end of text, 16 steps of caches reordered between
    beams, then the runtime's finalisation), on a clip where beam search and greedy differ, with
    3 then 2 beams, and 2 beams over a batch of two clips."""
    root, _ = exported
    model = transformers.WhisperForConditionalGeneration.from_pretrained(root / "source").eval()
    samples = loud_clip()
    write_wav(tmp_path / "clip.wav", samples, 16000)
    prompt = transformers.AutoTokenizer.from_pretrained(root / "source")(PROMPT, add_special_tokens=False)["input_ids"]
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(root / "source")
    features = features_of(extractor, samples)
    greedy = runtime_tokens(root / "out", tmp_path / "clip.wav")
    for beams in (3, 2):
        search = {"num_beams": beams, "length_penalty": 0.0, "early_stopping": True}
        with torch.no_grad():
            expected = model.generate(features, decoder_input_ids=torch.tensor([prompt]), max_new_tokens=16, **search)[0].tolist()
        assert len(expected) == 16 and expected != greedy
        assert runtime_tokens(root / "out", tmp_path / "clip.wav", **search) == expected
    # a batch of two clips, 2 beams each: each as generate alone
    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai does not install on this platform")
    other = speech_signal(16000, seconds=5.0)
    write_wav(tmp_path / "other.wav", other, 16000)
    runtime = og.Model(str(root / "out"))
    params = og.GeneratorParams(runtime)
    params.set_search_options(do_sample=False, max_length=4 + 16, batch_size=2, **search)
    generator = og.Generator(runtime, params)
    generator.set_inputs(runtime.create_multimodal_processor()(
        [PROMPT] * 2, audios=og.Audios.open(str(tmp_path / "clip.wav"), str(tmp_path / "other.wav"))))
    while not generator.is_done():
        generator.generate_next_token()
    with torch.no_grad():
        expected = [model.generate(features_of(extractor, clip), decoder_input_ids=torch.tensor([prompt]), max_new_tokens=16,
                                   **search)[0].tolist() for clip in (samples, other)]
    assert [[int(t) for t in generator.get_sequence(i)][4:] for i in range(2)] == expected


def test_genai_config_carries_the_generation_configs_beam_search(multilingual):
    root, _ = multilingual
    beams = transformers.GenerationConfig(num_beams=3, length_penalty=0.0, early_stopping=True)
    search = whisper_genai_config(transformers.WhisperConfig(), beams, "e.onnx", "d.onnx", HEADS, HEAD_SIZE, LAYERS)["search"]
    assert (search["num_beams"], search["length_penalty"], search["early_stopping"], search["do_sample"]) == (3, 0.0, True, False)
    never = whisper_genai_config(transformers.WhisperConfig(), transformers.GenerationConfig(num_beams=2, early_stopping="never"),
                                 "e.onnx", "d.onnx", HEADS, HEAD_SIZE, LAYERS)["search"]
    assert (never["num_beams"], never["early_stopping"]) == (2, False)
    # export-hf says where the runtime's beam search ranks unlike generate's
    assert beam_search_note(beams) is None and beam_search_note(transformers.GenerationConfig()) is None
    assert "length_penalty 0" in beam_search_note(transformers.GenerationConfig(num_beams=3, length_penalty=1.0))
    # the released config sets no beams: the folder decodes greedy, as generate does
    search = json.loads((root / "out" / "genai_config.json").read_text())["search"]
    assert (search["num_beams"], search["num_return_sequences"], search["length_penalty"]) == (1, 1, 1.0)


def test_suppress_lists_are_in_the_decoder_graph(multilingual):
    """-inf at the suppressed tokens in onnxruntime: begin-suppressed ones only in the last row
    of the call with an empty cache (the first generated token)."""
    root, result = multilingual
    path = root / "out" / "onnx" / "decoder.onnx"
    onnx.checker.check_model(os.fspath(path), full_check=True)
    generation = transformers.GenerationConfig.from_pretrained(root / "source")
    encoder = onnxruntime.InferenceSession(os.fspath(root / "out" / "onnx" / "encoder.onnx"), providers=["CPUExecutionProvider"])
    decoder = onnxruntime.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    features = np.random.default_rng(0).standard_normal((1, MULTILINGUAL_MEL_BINS, 3000)).astype(np.float32)
    cross = {o.name.replace("present_", "past_"): v for o, v in zip(encoder.get_outputs(), encoder.run(None, {"audio_features": features}))
             if "_cross_" in o.name}
    empty = {i.name: np.zeros((1, HEADS, 0, HEAD_SIZE), np.float32) for i in decoder.get_inputs() if "_self_" in i.name}
    outputs = dict(zip([o.name for o in decoder.get_outputs()],
                       decoder.run(None, {"input_ids": np.array([[50, 60, 70]]), **empty, **cross})))
    prompt_logits = outputs["logits"][0]
    begin_only = sorted(set(generation.begin_suppress_tokens) - set(generation.suppress_tokens))
    assert np.isneginf(prompt_logits[:, generation.suppress_tokens]).all()
    assert np.isneginf(prompt_logits[-1, begin_only]).all() and np.isfinite(prompt_logits[:-1, begin_only]).all()
    past = {name: outputs[name.replace("past_", "present_")] for name in empty}
    step = decoder.run(["logits"], {"input_ids": np.array([[80]]), **past, **cross})[0][0]
    assert np.isneginf(step[:, generation.suppress_tokens]).all() and np.isfinite(step[:, begin_only]).all()
    assert result.verification.passed and result.verification.genai_tokens == result.verification.torch_tokens


def test_verify_fails_a_folder_without_the_suppress_lists(multilingual):
    root, _ = multilingual
    folder = root / "out-without-lists"
    reference = transformers.WhisperForConditionalGeneration.from_pretrained(root / "source").eval()
    verification = verify_whisper_genai(folder, folder / "onnx" / "encoder.onnx", folder / "onnx" / "decoder.onnx", reference,
                                        root / "source", 8, tolerance_for(torch.float32))
    assert not verification.passed and not verification.within_tolerance
    assert "DIFFERENT" in verification.summary()


def test_verify_compares_the_window_decoded_once(tmp_path):
    """A model that emits two timestamps in a row: generate's default run decodes the audio
    again from the last one; --verify compares with the window decoded once, as the runtime
    decodes it, and says so."""
    save_multilingual_whisper(tmp_path / "source", timestamp_scale=2.0)  # timestamps picked often
    verification = export_hf(tmp_path / "source", tmp_path / "out", verify=True, tokens=16).verification
    timestamp_begin = transformers.GenerationConfig.from_pretrained(tmp_path / "source").no_timestamps_token_id + 1
    stamps = [t >= timestamp_begin for t in verification.torch_tokens]
    assert any(a and b for a, b in zip(stamps, stamps[1:]))
    assert verification.redecoded and "decodes the audio again" in verification.summary()
    assert verification.passed and verification.genai_tokens == verification.torch_tokens


def test_fake_mode_export_reads_the_suppress_lists(multilingual, tmp_path):
    """--fake builds the model from its config: the lists still come from generation_config.json."""
    root, _ = multilingual
    verification = export_hf(root / "source", tmp_path / "out", fake=True, verify=True, tokens=8).verification
    assert verification.passed and verification.genai_tokens == verification.torch_tokens
