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
import pytest
import tokenizers
import torch
import transformers

from fx2onnx.hub import export_hf
from fx2onnx.hub.verify import tolerance_for
from fx2onnx.hub.whisper_verify import speech_signal, verify_whisper_genai, write_wav

SPECIAL = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|fr|>", "<|translate|>", "<|transcribe|>", "<|startoflm|>",
           "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>"]
PROMPT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
LAYERS, HEADS, HEAD_SIZE, MEL_BINS = 2, 4, 16, 80


def save_whisper(folder, sampling_rate: int = 16000) -> None:
    """A random Whisper, its feature extractor and a byte-level BPE WhisperTokenizer with
    Whisper's special tokens."""
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(["the quick brown fox jumps over the lazy dog, hello world"] * 20, tokenizers.trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    model_json = json.loads(bpe.to_str())["model"]
    tokenizer = transformers.WhisperTokenizer(vocab=model_json["vocab"], merges=[tuple(m) if isinstance(m, list) else tuple(m.split())
                                                                                 for m in model_json["merges"]])
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
