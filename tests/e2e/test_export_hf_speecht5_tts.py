"""`export-hf` text-to-audio of SpeechT5 (fx2onnx/hub/recipes/speecht5_text_to_audio.py): a tiny
`SpeechT5ForTextToSpeech` and `SpeechT5HifiGan` (nothing downloaded), the vocoder given as
``vocoder``.

The folder holds `onnx/encoder_model.onnx`, `onnx/decoder_model_merged.onnx` and `vocoder/`
(the model's postnet, then the HiFi-GAN) with Transformers.js's input and output names; each
passes the full ONNX checker; `--verify` (the folder run as Transformers.js runs it, step by
step, against transformers' `generate_speech` without the prenet's dropout) passes on two
texts, one stopped by its stop probability, one by the maximum length; Transformers.js's
`generate_speech` with the vocoder folder gives transformers' spectrogram and waveform
within 1e-4, and its `text-to-audio` pipeline given text (the folder's tokenizer.json, written
from the source's SentencePiece character model) transformers' ids and waveform. Without a
vocoder, or with a vocoder for another model, the export is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.recipes.speecht5_text_to_audio import speaker_embedding, verification_texts
from fx2onnx.hub.shared.verification import tolerance_for
from fx2onnx.hub.speech.speecht5_verify import onnx_speech, verify_speecht5
from fx2onnx.hub.shared.tokenizer_files import CHECKED_STRINGS, write_folder_tokenizer
from fx2onnx.hub.speech.speecht5_tts import without_prenet_dropout
from sentencepiece_models import MAPPED, STRINGS, char_model, speecht5_tokenizer_folder, trained_char_model
from test_transformers_js import run_in_transformers_js, transformers_js  # noqa: F401 (fixture)

transformers = pytest.importorskip("transformers")

MEL_BINS, SPEAKER = 6, 10
CHARACTERS = "etaonihsrdlcu,.TH"  # no digits, few capitals: "2" and "W" are the unknown token
TEXTS = ("The hat sat.", "Hi,  Ted 2W")  # short: at 20 frames a token, within the model's 256 speech positions


def _models() -> tuple[transformers.SpeechT5ForTextToSpeech, transformers.SpeechT5HifiGan]:
    torch.manual_seed(0)
    config = transformers.SpeechT5Config(
        vocab_size=24, hidden_size=16, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_mel_bins=MEL_BINS,
        speech_decoder_prenet_units=12, speech_decoder_postnet_units=12, speaker_embedding_dim=SPEAKER,
        reduction_factor=2, speech_decoder_postnet_layers=2, speech_decoder_postnet_kernel=3, max_text_positions=64,
        max_speech_positions=256)
    model = transformers.SpeechT5ForTextToSpeech(config).eval()
    with torch.no_grad():  # weights large enough for the frames to differ, a stop probability near the threshold
        for name, parameter in model.named_parameters():
            if "norm" in name:  # layer norms as trained ones start: the frames then vary from step to step
                parameter.fill_(1.0 if name.endswith("weight") else 0.0)
            else:
                parameter.normal_(0, 0.3)
        model.speecht5.decoder.prenet.encode_positions.alpha.fill_(1.0)
        model.speech_decoder_postnet.prob_out.weight.mul_(5.0)  # a stop probability that varies from step to step
        model.speech_decoder_postnet.prob_out.bias.fill_(-1.0)
    vocoder = transformers.SpeechT5HifiGan(transformers.SpeechT5HifiGanConfig(
        model_in_dim=MEL_BINS, upsample_initial_channel=8, upsample_rates=[2, 2], upsample_kernel_sizes=[4, 4],
        resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1, 3]])).eval()
    with torch.no_grad():  # a normalization that is not the identity
        vocoder.mean.normal_(0, 0.1)
        vocoder.scale.uniform_(0.5, 1.5)
    return model, vocoder


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    folder = tmp_path_factory.mktemp("speecht5")
    model, vocoder = _models()
    model.save_pretrained(folder / "tts")
    # the tokenizer files as the released checkpoint has them: a character SentencePiece model,
    # its 22 pieces then <mask> and <ctc_blank> (the model's 24 tokens)
    speecht5_tokenizer_folder(folder / "tts", char_model(CHARACTERS), old_files=True)
    # the processor as transformers 5 saves it: processor_config.json alone (the folder gets the
    # preprocessor_config.json Transformers.js's pipeline loads a processor from)
    settings = transformers.SpeechT5FeatureExtractor(num_mel_bins=MEL_BINS).to_dict()
    (folder / "tts" / "processor_config.json").write_text(json.dumps(
        {"feature_extractor": settings, "processor_class": "SpeechT5Processor"}))
    vocoder.save_pretrained(folder / "hifigan")
    result = export_hf(folder / "tts", folder / "out", vocoder=folder / "hifigan", verify=True)
    return model, vocoder, result


def _dims(path: Path) -> dict[str, list]:
    graph = onnx.load(str(path), load_external_data=False).graph
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in [*graph.input, *graph.output]}


def test_speecht5_folder_has_transformers_js_s_models_and_verifies(released):
    model, _, result = released
    assert result.task == "text-to-audio"
    assert {"onnx/encoder_model.onnx", "onnx/decoder_model_merged.onnx", "vocoder/onnx/model.onnx", "vocoder/config.json",
            "config.json"} <= set(result.files)
    assert result.verification.passed and result.verification.max_logit_difference < 1e-4
    folder = result.folder
    for name in ("onnx/encoder_model.onnx", "onnx/decoder_model_merged.onnx", "vocoder/onnx/model.onnx"):
        onnx.checker.check_model(str(folder / name), full_check=True)
    assert _dims(folder / "onnx/encoder_model.onnx") == {
        "input_ids": ["batch_size", "sequence_length"], "encoder_outputs": ["batch_size", "sequence_length", 16],
        "encoder_attention_mask": ["batch_size", "sequence_length"]}
    decoder = _dims(folder / "onnx/decoder_model_merged.onnx")
    assert decoder["past_key_values.1.decoder.key"] == ["batch_size", 2, "past_sequence_length", 8]
    assert decoder["past_key_values.1.encoder.value"] == ["batch_size", 2, "encoder_sequence_length", 8]
    assert decoder["prob"] == ["batch_size", 1] and decoder["spectrum"][-1] == MEL_BINS
    assert {"output_sequence", "speaker_embeddings", "encoder_hidden_states", "encoder_attention_mask", "use_cache_branch",
            "output_sequence_out", "present.0.decoder.key"} <= set(decoder)
    assert _dims(folder / "vocoder/onnx/model.onnx") == {"spectrogram": ["num_frames", MEL_BINS],
                                                         "waveform": [1, "4*num_frames"]}
    # the model type Transformers.js maps to SpeechT5HifiGan
    assert json.loads((folder / "vocoder/config.json").read_text())["model_type"] == "hifigan"


def test_speecht5_in_transformers_js_generate_speech(released, tmp_path, transformers_js):  # noqa: F811 (fixture)
    """Transformers.js's generate_speech on the folder, its vocoder loaded from vocoder/, gives
    transformers' spectrogram and waveform (no prenet dropout), one text stopped by its stop
    probability before the maximum length, the other at it (the texts --verify speaks)."""
    model, vocoder, result = released
    speaker, texts = speaker_embedding(model.config), [ids[0].tolist() for ids in verification_texts(model.config)]
    job = {"folder": str(result.folder), "task": "text-to-audio", "spectrogram": {
        "texts": texts, "speaker_embeddings": speaker[0].tolist(), "vocoder": str(result.folder / "vocoder")}}
    got = run_in_transformers_js(transformers_js, tmp_path, job)["spectrogram"]
    lengths = []
    for ids, run in zip(texts, got):
        with torch.no_grad(), without_prenet_dropout(model):
            spectrogram = model.generate_speech(torch.tensor([ids]), speaker)
            waveform = vocoder(spectrogram)
        assert run["vocoder"] == "SpeechT5HifiGan"
        # Transformers.js's spectrogram is the decoder's spectra, before the postnet the vocoder graph runs
        with torch.no_grad():
            postnet = model.speech_decoder_postnet.postnet(torch.tensor(run["spectrogram"]["data"]).view(1, -1, MEL_BINS))[0]
        assert tuple(postnet.shape) == tuple(spectrogram.shape)
        np.testing.assert_allclose(postnet.numpy(), spectrogram.numpy(), rtol=0, atol=1e-4)
        assert run["waveform"]["dims"] == [1, waveform.shape[-1]]
        # the tiny vocoder's samples are about 1e-6: within 1e-4 of their largest
        np.testing.assert_allclose(np.array(run["waveform"]["data"]), waveform.numpy().ravel(), rtol=0,
                                   atol=1e-4 * np.abs(waveform.numpy()).max())
        lengths.append(spectrogram.shape[0])
    maxlen = [int(len(ids) / model.config.reduction_factor * 20) * model.config.reduction_factor for ids in texts]
    # one text stopped by its stop probability after steps over the cache, the other by the maximum length
    assert 4 * model.config.reduction_factor <= lengths[0] < maxlen[0] and lengths[1] == maxlen[1]


def test_speecht5_text_to_audio_pipeline_speaks_text_in_transformers_js(released, tmp_path, transformers_js):  # noqa: F811
    """Transformers.js's `text-to-audio` pipeline on the folder, given text (its vocoder set from
    `vocoder/`): the folder's tokenizer.json gives transformers' SpeechT5Tokenizer's ids, and the
    pipeline transformers' `generate_speech` waveform through the vocoder (same length, within
    1e-4 of its largest sample)."""
    pytest.importorskip("sentencepiece")  # transformers' SpeechT5Tokenizer, the reference, runs it
    model, vocoder, result = released
    assert "tokenizer.json" in result.files
    tokenizer = transformers.AutoTokenizer.from_pretrained(result.folder)  # the folder's files, as transformers reads them
    strings = [*CHECKED_STRINGS, *TEXTS, "", "  The   end  "]
    speaker = speaker_embedding(model.config)
    job = {"folder": str(result.folder), "task": "text-to-audio", "strings": strings, "speak": {
        "texts": list(TEXTS), "speaker_embeddings": speaker[0].tolist(), "vocoder": str(result.folder / "vocoder")}}
    got = run_in_transformers_js(transformers_js, tmp_path, job)
    assert got["encoded"] == [tokenizer(text)["input_ids"] for text in strings]
    assert tokenizer.unk_token_id in tokenizer(TEXTS[1])["input_ids"]  # "2W": one unknown token
    lengths = set()
    for text, run in zip(TEXTS, got["speak"]):
        with torch.no_grad(), without_prenet_dropout(model):
            waveform = vocoder(model.generate_speech(tokenizer(text, return_tensors="pt")["input_ids"], speaker)).numpy()
        assert run["sampling_rate"] == 16000 and len(run["audio"]) == waveform.shape[-1]
        # the tiny vocoder's samples are about 1e-6: within 1e-4 of their largest (measured: 2e-6 of it)
        scale = np.abs(waveform).max()
        np.testing.assert_allclose(np.array(run["audio"]), waveform, rtol=0, atol=1e-4 * scale)
        lengths.add(waveform.shape[-1])
    assert len(lengths) == 2  # each text its own length


@pytest.mark.parametrize("model", ["identity", "nmt_nfkc"])
def test_sentencepiece_tokenizer_json_in_transformers_js(tmp_path, transformers_js, model):  # noqa: F811 (fixture)
    """The tokenizer.json written for SpeechT5Tokenizer's character model, read by
    Transformers.js's tokenizer, gives transformers' ids: a model without a character map
    (built with protobuf), and one SentencePiece's trainer wrote with the `nmt_nfkc` rule's
    map (which Transformers.js's `Precompiled` normalizer applies as NFKC and its own spaces)."""
    pytest.importorskip("sentencepiece")  # transformers' SpeechT5Tokenizer, the reference, runs it
    source, out = tmp_path / "source", tmp_path / "out"
    speecht5_tokenizer_folder(source, char_model() if model == "identity" else trained_char_model(), old_files=True)
    out.mkdir()
    write_folder_tokenizer(source, out, False, lambda line: None)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    strings = [*CHECKED_STRINGS, *STRINGS, *MAPPED]
    encoded = run_in_transformers_js(transformers_js, tmp_path, {"folder": str(out), "task": "text-to-audio",
                                                                 "strings": strings})["encoded"]
    assert encoded == [tokenizer(text)["input_ids"] for text in strings]


def test_speecht5_without_a_vocoder_or_with_another_s_is_refused(tmp_path):
    model, vocoder = _models()
    model.save_pretrained(tmp_path / "tts")
    with pytest.raises(ValueError, match="give it with --vocoder"):
        export_hf(tmp_path / "tts", tmp_path / "out")
    vocoder.config.model_in_dim = MEL_BINS + 2
    transformers.SpeechT5HifiGan(vocoder.config).save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match=f"reads {MEL_BINS + 2} mel bins where the model writes {MEL_BINS}"):
        export_hf(tmp_path / "tts", tmp_path / "out", vocoder=tmp_path / "other")
    assert not (tmp_path / "out").exists()


def test_verify_fails_a_tiny_vocoder_s_wrong_waveform(released, tmp_path):
    """The tiny vocoder's samples are far below the tolerance's atol: a folder whose vocoder
    gives them 1.5 times as large (its last convolution's weight scaled) fails --verify, as
    its waveform is compared relative to transformers' largest sample (peak_scale.py)."""
    model, vocoder, result = released
    folder = result.folder
    altered = onnx.load(str(folder / "vocoder/onnx/model.onnx"))
    weight = next(t for t in altered.graph.initializer if t.name.endswith("conv_post.weight"))
    weight.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(weight) * 1.5, weight.name))
    onnx.save(altered, str(tmp_path / "model.onnx"), save_as_external_data=True, location="model.onnx_data")
    paths = [folder / "onnx/encoder_model.onnx", folder / "onnx/decoder_model_merged.onnx"]
    texts, speaker = verification_texts(model.config), speaker_embedding(model.config)
    _, waveform = onnx_speech(*paths, tmp_path / "model.onnx", texts[0].numpy(), speaker.numpy(),
                              model.config.reduction_factor, MEL_BINS)
    with torch.no_grad(), without_prenet_dropout(model):
        expected = vocoder(model.generate_speech(texts[0], speaker)).numpy()
    # wrong by a third of every sample, yet within 1e-4 of transformers' waveform
    assert np.abs(waveform.ravel() - expected.ravel()).max() < 1e-4
    wrong = verify_speecht5(*paths, tmp_path / "model.onnx", model, vocoder, texts, speaker, tolerance_for(torch.float32))
    assert not wrong.passed and wrong.worst_ratio > 100
    assert result.verification.passed  # the folder as written, by the same rule
