"""`export-hf` speech recognition by encoder-decoders other than Whisper (fx2onnx/hub/speech/):
the encoder takes the model's own audio input as its feature extractor gives it, log-mel
frames first (Speech2Text: `input_features` (batch, frames, mel)) or the waveform
(Moonshine: `input_values` (batch, samples)), the decoder Optimum's merged one.

`--verify` compares the folder's greedy tokens with transformers' greedy `generate` on
batches of clips of two lengths; here the folder is also run on a clip of a third length,
longer than both, against `generate`; its models pass the full ONNX checker, and
Transformers.js (Node) transcribes with the Moonshine folder as transformers does; an error
planted in the decoder fails the verification. A model
transformers files under speech sequence-to-sequence whose encoder reads text (Dia, a
text-to-speech model) is refused before anything is written."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.shared.verification import tolerance_for
from fx2onnx.hub.speech.audio_input import speech_examples
from fx2onnx.hub.speech.speech_verify import verify_speech_seq2seq
from fx2onnx.hub.speech.transformers_js_speech import client_note
from fx2onnx.hub.tasks import UnsupportedArchitectureError
from test_export_hf import plant_error
from test_transformers_js import node_run, run_in_transformers_js, trained_tokenizer, transformers_js  # noqa: F401 (fixture)

transformers = pytest.importorskip("transformers")

TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1}
NEW_TOKENS = 8


def _varied(model: torch.nn.Module, std: float = 0.3) -> torch.nn.Module:
    """Weights drawn wider than the initial ones, so that greedy decoding varies its tokens."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, std, generator=torch.Generator().manual_seed(parameter.numel()))
    return model.eval()


def save_speech_to_text(folder: Path, vocab: int = 100) -> torch.nn.Module:
    """A two-layer Speech2Text with its feature extractor (80 mel bins, frames first)."""
    config = transformers.Speech2TextConfig(
        vocab_size=vocab, d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, conv_channels=32, max_source_positions=256, max_target_positions=64,
        **TOKENS)
    model = _varied(transformers.Speech2TextForConditionalGeneration(config))
    model.save_pretrained(folder)
    transformers.Speech2TextFeatureExtractor(feature_size=80, num_mel_bins=80).save_pretrained(folder)
    return model


def save_moonshine(folder: Path, vocab: int = 100) -> torch.nn.Module:
    """A two-layer Moonshine with the feature extractor its checkpoints ship (the waveform as is)."""
    config = transformers.MoonshineConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, encoder_num_hidden_layers=1, decoder_num_hidden_layers=2,
        encoder_num_attention_heads=4, decoder_num_attention_heads=4, encoder_num_key_value_heads=4,
        decoder_num_key_value_heads=4, max_position_embeddings=128, **TOKENS)
    model = _varied(transformers.MoonshineForConditionalGeneration(config))
    model.save_pretrained(folder)
    transformers.Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, do_normalize=False,
                                          return_attention_mask=False).save_pretrained(folder)
    return model


def save_speecht5(folder: Path, vocab: int = 100) -> torch.nn.Module:
    """A SpeechT5 for speech-to-text (a waveform encoder of two convolutions) with its feature extractor."""
    config = transformers.SpeechT5Config(
        vocab_size=vocab, hidden_size=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, conv_dim=(32, 32), conv_stride=(5, 4),
        conv_kernel=(10, 8), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, max_speech_positions=512,
        max_text_positions=64, **TOKENS)
    model = _varied(transformers.SpeechT5ForSpeechToText(config))
    model.save_pretrained(folder)
    transformers.SpeechT5FeatureExtractor().save_pretrained(folder)
    return model


# the tokens of Cohere ASR's decoder prompt for English (CohereAsrProcessor.get_decoder_prompt_ids)
COHERE_PROMPT_TOKENS = ("<|startofcontext|>", "<|startoftranscript|>", "<|emo:undefined|>", "<|en|>", "<|pnc|>", "<|noitn|>",
                        "<|notimestamp|>", "<|nodiarize|>")


def save_cohere_asr(folder: Path, vocab: int = 100) -> torch.nn.Module:
    """A Cohere ASR (a Parakeet encoder, 128 mel bins frames first) with its feature extractor
    (no dither: transformers' and Transformers.js's noise differ) saved as transformers 5 saves
    its processor (`processor_config.json` alone), with the tokenizer already in ``folder``.
    Its decoder starts with the prompt's first token, "\u2581" (else transformers' generate puts
    the start token before the prompt, which Transformers.js sends as it is)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    encoder = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4, intermediate_size=64,
                   subsampling_conv_channels=16, num_mel_bins=128)
    config = transformers.CohereAsrConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, head_dim=8,
        intermediate_size=64, max_position_embeddings=128, encoder_config=encoder,
        **{**TOKENS, "decoder_start_token_id": tokenizer.convert_tokens_to_ids("\u2581")})
    model = _varied(transformers.CohereAsrForConditionalGeneration(config), std=0.5)
    model.save_pretrained(folder)
    transformers.CohereAsrProcessor(transformers.CohereAsrFeatureExtractor(dither=0.0), tokenizer).save_pretrained(folder)
    return model


def cohere_tokenizer(tokenizer):
    tokenizer.add_tokens(list(COHERE_PROMPT_TOKENS), special_tokens=True)
    tokenizer.add_tokens(["\u2581"])
    return tokenizer


# kind -> builder, the encoder's input and its dims (None: not checked: Parakeet's mel bins are a free dim)
MODELS = {"speech_to_text": (save_speech_to_text, "input_features", ["batch_size", "num_frames", 80]),
          "moonshine": (save_moonshine, "input_values", ["batch_size", "num_samples"]),
          "speecht5": (save_speecht5, "input_values", ["batch_size", "num_samples"]),
          "cohere_asr": (save_cohere_asr, "input_features", ["batch_size", "num_frames", None])}
# the kinds whose feature extractor returns the mask of a padded batch, which their folders read
# (the Moonshine extractor of these tests returns none, as return_attention_mask=False says)
MASKED = ("speech_to_text", "speecht5", "cohere_asr")


def clip(seconds: float, seed: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(int(16000 * seconds))).astype(np.float32)


def folder_greedy(out: Path, inputs: dict[str, np.ndarray], steps: int, start: int) -> list[list[int]]:
    """Greedy decoding of a batch of clips with the folder's encoder and merged decoder, as
    Transformers.js chains them (the decoder given the encoder's input mask where it reads
    one): each row's tokens."""
    encoder = ort.InferenceSession(os.fspath(out / "onnx" / "encoder_model.onnx"))
    decoder = ort.InferenceSession(os.fspath(out / "onnx" / "decoder_model_merged.onnx"))
    hidden = encoder.run(["last_hidden_state"], {name: inputs[name] for name in optional_inputs(encoder) if name in inputs})[0]
    batch = hidden.shape[0]
    pasts = [i for i in decoder.get_inputs() if i.name.startswith("past_key_values.")]
    cache = {i.name: np.zeros((batch, i.shape[1], 0, i.shape[3]), dtype=np.float32) for i in pasts}  # unused by the first step
    mask = {"encoder_attention_mask": inputs["attention_mask"]} if "attention_mask" in inputs else {}
    tokens = np.full((batch, 1), start, dtype=np.int64)
    for step in range(steps):
        feed = {"input_ids": tokens[:, -1:], "encoder_hidden_states": hidden, "use_cache_branch": np.array([step > 0]),
                **mask, **cache}
        outputs = dict(zip([o.name for o in decoder.get_outputs()], decoder.run(None, feed)))
        tokens = np.concatenate([tokens, outputs["logits"][:, -1].argmax(-1)[:, None]], axis=1)
        cache = {name: outputs[name.replace("past_key_values.", "present.")] for name in cache}
    return tokens[:, 1:].tolist()


def optional_inputs(session) -> list[str]:
    """The session's inputs and its optional ones (a default for each: the mask)."""
    return [i.name for i in [*session.get_inputs(), *session.get_overridable_initializers()]]


def extracted(folder: Path, clips: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The folder's feature extractor's inputs for ``clips``, padded to the longest as
    transformers' pipeline pads a batch (the extractor's own padding: Whisper's 30 s), the
    mask as int64."""
    extractor = transformers.AutoFeatureExtractor.from_pretrained(folder)
    padding = {"padding": True} if isinstance(extractor, (transformers.Wav2Vec2FeatureExtractor,
                                                         transformers.Speech2TextFeatureExtractor,
                                                         transformers.SpeechT5FeatureExtractor)) else {}
    features = extractor(clips, sampling_rate=16000, return_tensors="np", **padding)
    return {name: value.astype(np.int64 if name == "attention_mask" else np.float32) for name, value in features.items()
            if isinstance(value, np.ndarray)}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module, object]]:
    """Each model saved with a tokenizer (Transformers.js's pipeline decodes with it) and
    exported with --verify, once: its source, model and export_hf's result."""
    made = {}
    tokenizer = trained_tokenizer()
    for kind, (save, _, _) in MODELS.items():
        root = tmp_path_factory.mktemp(kind)
        kind_tokenizer = cohere_tokenizer(trained_tokenizer()) if kind == "cohere_asr" else tokenizer
        kind_tokenizer.save_pretrained(root / "source")
        model = save(root / "source", len(kind_tokenizer))
        made[kind] = (root, model, export_hf(root / "source", root / "out", verify=True, tokens=NEW_TOKENS))
    return made


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_speech_encoder_decoder_folder(folders, kind):
    _, input_name, input_dims = MODELS[kind]
    root, model, result = folders[kind]
    assert result.task == "automatic-speech-recognition"
    # greedy tokens of two batches (2 clips of 1 s, 3 of 1.55 s) equal generate's, logits within 1e-4
    verification = result.verification
    assert verification.passed and verification.tokens_equal and verification.max_logit_difference < 1e-4
    assert len(verification.onnx_tokens) == 2 * NEW_TOKENS and len(set(verification.onnx_tokens)) > 2
    out = root / "out"
    for name in ("encoder_model.onnx", "decoder_model_merged.onnx"):
        onnx.checker.check_model(os.fspath(out / "onnx" / name), full_check=True)
    encoder = onnx.load(os.fspath(out / "onnx" / "encoder_model.onnx"), load_external_data=False)
    assert [i.name for i in encoder.graph.input] == [input_name] + (["attention_mask"] if kind in MASKED else [])
    # the mask is optional: a default of its name (a row attending nothing: every frame attended)
    defaults = {i.name: list(i.dims) for i in encoder.graph.initializer if i.name in {v.name for v in encoder.graph.input}}
    assert defaults == ({"attention_mask": [1, 1]} if kind in MASKED else {})
    dims = [d.dim_param or d.dim_value for d in encoder.graph.input[0].type.tensor_type.shape.dim]
    assert [dim if expected is not None else None for dim, expected in zip(dims, input_dims)] == input_dims
    # the merged decoder's free dims are the roles the other encoder-decoders' name; the encoder's
    # width and the cross-attention cache's heads (free in the next steps' capture) the config's
    decoder = onnx.load(os.fspath(out / "onnx" / "decoder_model_merged.onnx"), load_external_data=False)
    free = {d.dim_param for v in [*decoder.graph.input, *decoder.graph.output] for d in v.type.tensor_type.shape.dim}
    # with the mask of the encoder's input (its time: frames or samples) where the folder reads one
    time = ({input_dims[1]} if kind in MASKED else set())
    assert free - {""} == {"batch_size", "sequence_length", "encoder_sequence_length", "past_sequence_length",
                           "total_sequence_length"} | time
    shapes = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in decoder.graph.input}
    if kind in MASKED:
        assert shapes["encoder_attention_mask"] == ["batch_size", input_dims[1]]
    config = model.config
    heads = getattr(config, "decoder_attention_heads", None) or getattr(config, "decoder_num_key_value_heads", None) \
        or config.num_key_value_heads
    assert shapes["encoder_hidden_states"][2] == (getattr(config, "encoder_config", None) or config).hidden_size
    assert shapes["past_key_values.0.encoder.key"] == ["batch_size", heads, "encoder_sequence_length", shapes["past_key_values.0.encoder.key"][3]]
    assert isinstance(shapes["past_key_values.0.encoder.key"][3], int)
    # a clip longer than both of the export's, through the folder's own feature extractor
    features = extracted(out, [clip(2.3, 5)])
    with torch.no_grad():
        expected = model.generate(**{name: torch.from_numpy(value) for name, value in features.items()}, do_sample=False,
                                  max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)[:, 1:].tolist()
    assert folder_greedy(out, features, NEW_TOKENS, model.config.decoder_start_token_id) == expected


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_a_padded_batch_of_two_clips_generates_transformers_tokens(folders, kind):
    """Two clips of 2.1 s and 0.9 s as the folder's feature extractor pads them (with its
    mask where it returns one): the folder's 16 greedy tokens of each row are those of
    transformers' `generate` on the same padded batch; where the folder reads the mask,
    transformers' padded row differs without it (the mask is what makes the row exact)."""
    root, model, _ = folders[kind]
    features = extracted(root / "out", [clip(2.1, 11), clip(0.9, 12)])
    assert ("attention_mask" in features) == (kind in MASKED)
    given = {name: torch.from_numpy(value) for name, value in features.items()}

    def generated(inputs: dict[str, torch.Tensor]) -> tuple[list[list[int]], torch.Tensor]:
        with torch.no_grad():
            out = model.generate(**inputs, do_sample=False, max_new_tokens=16, min_new_tokens=16, output_logits=True,
                                 return_dict_in_generate=True)
        return out.sequences[:, 1:].tolist(), torch.stack(out.logits)

    expected, logits = generated(given)
    assert folder_greedy(root / "out", features, 16, model.config.decoder_start_token_id) == expected
    assert len({token for row in expected for token in row}) > 2
    if kind in MASKED:
        unmasked, unmasked_logits = generated({k: v for k, v in given.items() if k != "attention_mask"})
        assert (unmasked_logits[0, 1] - logits[0, 1]).abs().max() > 1e-3  # the padded row's first step
        # the mask is optional (Transformers.js gives none): without it, transformers' tokens without it
        plain = {name: value for name, value in features.items() if name != "attention_mask"}
        assert folder_greedy(root / "out", plain, 16, model.config.decoder_start_token_id) == unmasked


def test_moonshine_folder_in_transformers_js(folders, tmp_path, transformers_js):  # noqa: F811 (fixture)
    """The Moonshine folder as Transformers.js loads it (`encoder_model.onnx`,
    `decoder_model_merged.onnx`, the Wav2Vec2 feature extractor, the tokenizer): its
    `generate` gives transformers' tokens on clips of two lengths, and its
    `pipeline("automatic-speech-recognition")` the text of those tokens."""
    root, model, _ = folders["moonshine"]
    clips = [clip(1.0, 7), clip(2.3, 8)]
    options = {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS}
    job = {"folder": str(root / "out"), "task": "automatic-speech-recognition",
           "speech": {"clips": [samples.tolist() for samples in clips], "options": options, "pipeline": True}}
    result = run_in_transformers_js(transformers_js, tmp_path, job)["speech"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(root / "source")
    for samples, features, generated, text in zip(clips, result["features"], result["generated"], result["texts"]):
        np.testing.assert_array_equal(np.reshape(features["data"], features["dims"]), samples[None].astype(np.float32))
        with torch.no_grad():
            expected = model.generate(input_values=torch.from_numpy(samples[None]), do_sample=False, **options)[0, 1:].tolist()
        assert generated == expected and len(set(expected)) > 2
        assert text == tokenizer.decode(expected, skip_special_tokens=True)


def test_cohere_asr_folder_in_transformers_js(folders, tmp_path, transformers_js):  # noqa: F811 (fixture)
    """The Cohere ASR folder as Transformers.js loads it: CohereAsrProcessor (the folder's
    `preprocessor_config.json` names it, its `processor_config.json` is the source's), whose
    features are transformers' and whose prompt is transformers' processor's; `generate` from
    that prompt gives transformers' 16 tokens, and the pipeline, which builds the prompt itself,
    their text."""
    root, model, _ = folders["cohere_asr"]
    processor = transformers.AutoProcessor.from_pretrained(root / "source")
    prompt = processor.get_decoder_prompt_ids(language="en")
    clips = [clip(1.0, 7), clip(2.3, 8)]
    steps = {"max_new_tokens": 16, "min_new_tokens": 16}
    job = {"folder": str(root / "out"), "task": "automatic-speech-recognition",
           "speech": {"clips": [samples.tolist() for samples in clips], "options": {"decoder_input_ids": prompt, **steps},
                      "pipeline_options": {"language": "en", **steps}, "language": "en", "pipeline": True}}
    result = run_in_transformers_js(transformers_js, tmp_path, job)["speech"]
    assert result["processor"] == "CohereAsrProcessor" and result["prompt_ids"] == prompt
    tokens = []
    for samples, features, generated, text in zip(clips, result["features"], result["generated"], result["texts"]):
        inputs = processor(samples, language="en", sampling_rate=16000, return_tensors="pt")
        # log-mel features: Transformers.js's float32 spectrogram within 4e-5 of transformers' (relative)
        np.testing.assert_allclose(np.reshape(features["data"], features["dims"]), inputs["input_features"].numpy(),
                                   rtol=1e-4, atol=1e-4)
        with torch.no_grad():
            sequence = model.generate(input_features=inputs["input_features"], decoder_input_ids=inputs["decoder_input_ids"],
                                      do_sample=False, **steps)[0].tolist()
        expected = sequence[len(prompt):]
        assert sequence[:len(prompt)] == prompt and generated == expected and len(expected) == 16
        # the pipeline decodes the whole sequence, prompt too (its "\u2581" is this tokenizer's plain token)
        assert text == processor.decode(sequence, skip_special_tokens=True).strip()
        tokens += expected
    assert len(set(tokens)) > 2


def test_speecht5_folder_in_transformers_js_fails_as_its_note_says(folders, tmp_path, transformers_js):  # noqa: F811
    """Transformers.js 4.3.2 loads the SpeechT5 folder but its SpeechT5FeatureExtractor has no
    `_call` (and its model class feeds the encoder no `input_values`): the folder's note says so."""
    root, _, _ = folders["speecht5"]
    job = {"folder": str(root / "out"), "task": "automatic-speech-recognition",
           "speech": {"clips": [clip(1.0, 7).tolist()], "options": {"max_new_tokens": NEW_TOKENS}}}
    done = node_run(transformers_js, tmp_path, job)
    assert done.returncode != 0 and "Must implement _call method in subclass" in done.stderr
    note = client_note(json.loads((root / "out" / "config.json").read_text(encoding="utf-8")))
    assert "cannot transcribe" in note and "Must implement _call method in subclass" in note
    assert "Missing the following inputs: input_values" in note


def test_text_to_speech_is_refused_before_writing(tmp_path):
    """Dia is filed under speech sequence-to-sequence, but its encoder reads text and its decoder writes audio codes."""
    encoder = transformers.DiaEncoderConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                            num_key_value_heads=2, head_dim=16, vocab_size=64)
    ids = dict(pad_token_id=61, eos_token_id=60, bos_token_id=62)
    decoder = transformers.DiaDecoderConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                            num_key_value_heads=2, head_dim=16, cross_num_attention_heads=2,
                                            cross_head_dim=16, cross_num_key_value_heads=2, cross_hidden_size=32,
                                            num_channels=3, vocab_size=64, **ids)
    config = transformers.DiaConfig(encoder_config=encoder, decoder_config=decoder, delay_pattern=[0, 1, 2], **ids)
    transformers.DiaForConditionalGeneration(config).save_pretrained(tmp_path / "source")
    with pytest.raises(UnsupportedArchitectureError, match="its encoder reads input_ids, not audio.*text-to-speech.*Nothing was written"):
        export_hf(tmp_path / "source", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_verify_sees_an_error_in_the_decoder(folders, tmp_path):
    """1e-2 added to the merged decoder's logits: the verification fails on the logits alone
    (a constant added to every logit keeps the greedy tokens)."""
    root, model, _ = folders["speech_to_text"]
    shutil.copytree(root / "out", tmp_path / "out")
    onnx_folder = tmp_path / "out" / "onnx"
    assert plant_error(onnx_folder / "decoder_model_merged.onnx", 1e-2) == ["logits"]
    inputs = speech_examples(root / "source", model.config, model, 1)
    verification = verify_speech_seq2seq(onnx_folder / "encoder_model.onnx", onnx_folder / "decoder_model_merged.onnx", model,
                                         inputs, NEW_TOKENS, tolerance_for(torch.float32))
    assert not verification.passed and verification.tokens_equal
    assert verification.max_logit_difference == pytest.approx(1e-2, rel=1e-3)


def test_a_padded_batch_with_module_functions(tmp_path):
    """Speech2Text written with module functions (the encoder's and the merged decoder's
    modules as ONNX functions, the optional masks' defaults in the main graphs): --verify on
    its padded batches, and the 2.1 s and 0.9 s clips' 16 tokens per row as transformers'."""
    tokenizer = trained_tokenizer()
    tokenizer.save_pretrained(tmp_path / "source")
    model = save_speech_to_text(tmp_path / "source", len(tokenizer))
    result = export_hf(tmp_path / "source", tmp_path / "out", verify=True, tokens=NEW_TOKENS, module_functions=True)
    assert result.verification.passed and result.verification.tokens_equal
    for name in ("encoder_model.onnx", "decoder_model_merged.onnx"):
        onnx.checker.check_model(os.fspath(tmp_path / "out" / "onnx" / name), full_check=True)
        assert onnx.load(os.fspath(tmp_path / "out" / "onnx" / name), load_external_data=False).functions
    features = extracted(tmp_path / "out", [clip(2.1, 11), clip(0.9, 12)])
    with torch.no_grad():
        expected = model.generate(**{k: torch.from_numpy(v) for k, v in features.items()}, do_sample=False, max_new_tokens=16,
                                  min_new_tokens=16)[:, 1:].tolist()
    assert folder_greedy(tmp_path / "out", features, 16, model.config.decoder_start_token_id) == expected
