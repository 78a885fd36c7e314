"""SpeechT5 text-to-speech's pieces (fx2onnx/hub/speech/speecht5_tts.py, speecht5_verify.py,
recipes/speecht5_text_to_audio.py): the prenet's dropout taken out and put back, the decoding
step's outputs as Transformers.js reads them, the vocoder checked against the model, the
recipe the table picks, the processor file Transformers.js's pipeline reads, and the merged
decoder's self-attention cache length left free."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from fx2onnx.hub.recipe_table import recipe_for
from fx2onnx.hub.recipes import speecht5_text_to_audio
from fx2onnx.hub.recipes.speecht5_text_to_audio import processor_files, vocoder_refusal
from fx2onnx.hub.shared.merged_decoder import USE_CACHE_BRANCH, merge_decoders
from fx2onnx.hub.speech.speecht5_tts import DecoderStep, SpeechEncoder, first_spectrum, without_prenet_dropout
from fx2onnx.hub.speech.speecht5_verify import MAXLENRATIO, THRESHOLD

transformers = pytest.importorskip("transformers")


def _model() -> transformers.SpeechT5ForTextToSpeech:
    torch.manual_seed(0)
    return transformers.SpeechT5ForTextToSpeech(transformers.SpeechT5Config(
        vocab_size=20, hidden_size=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_mel_bins=6, speech_decoder_prenet_units=12,
        speaker_embedding_dim=10, reduction_factor=3, speech_decoder_postnet_layers=2)).eval()


def test_the_prenet_without_its_dropout_is_deterministic_and_put_back_after():
    model, sequence, speaker = _model(), torch.randn(1, 4, 6), torch.randn(1, 10)
    prenet = model.speecht5.decoder.prenet
    with torch.no_grad():
        with without_prenet_dropout(model):
            quiet = [prenet(sequence, speaker) for _ in range(2)]
        noisy = [prenet(sequence, speaker) for _ in range(2)]
    torch.testing.assert_close(quiet[0], quiet[1], rtol=0, atol=0)
    assert not torch.equal(noisy[0], noisy[1])  # transformers' masks drawn at every call, even in eval
    assert "_consistent_dropout" not in vars(prenet)


def test_a_step_gives_the_spectra_transformers_js_concatenates_and_the_summed_stop_probability():
    model = _model()
    ids = torch.tensor([[5, 6, 7, 1], [8, 9, 10, 11]])  # the first row padded (pad id 1)
    with torch.no_grad(), without_prenet_dropout(model):
        encoded = SpeechEncoder(model)(ids)
        step = DecoderStep(model)(first_spectrum(6, 2), torch.randn(2, 10), encoded["encoder_outputs"],
                                  encoded["encoder_attention_mask"])
        last = model.speecht5.decoder.wrapped_decoder(
            hidden_states=model.speecht5.decoder.prenet(first_spectrum(6, 2), None)[:, -1:],
            encoder_hidden_states=encoded["encoder_outputs"]).last_hidden_state
    assert encoded["encoder_attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert tuple(step["spectrum"].shape) == (2 * 3, 6)  # (batch x reduction_factor, mel bins)
    assert tuple(step["prob"].shape) == (2, 1) and tuple(step["output_sequence_out"].shape) == (2, 2, 6)
    torch.testing.assert_close(step["output_sequence_out"][:, -1], step["spectrum"].view(2, 3, 6)[:, -1])
    assert tuple(last.shape) == (2, 1, 16)
    assert (THRESHOLD, MAXLENRATIO) == (0.5, 20.0)  # transformers' and Transformers.js's defaults


def test_a_vocoder_for_other_mel_bins_or_of_another_kind_is_refused(tmp_path):
    config = _model().config
    (tmp_path / "hifigan").mkdir()
    (tmp_path / "hifigan" / "config.json").write_text(json.dumps({"model_type": "hifigan", "model_in_dim": 6}))
    assert vocoder_refusal(str(tmp_path / "hifigan"), config) is None
    (tmp_path / "hifigan" / "config.json").write_text(json.dumps({"model_type": "speecht5_hifigan", "model_in_dim": 80}))
    assert "reads 80 mel bins where the model writes 6" in vocoder_refusal(str(tmp_path / "hifigan"), config)
    (tmp_path / "hifigan" / "config.json").write_text(json.dumps({"model_type": "vits"}))
    assert "a vits checkpoint; give a SpeechT5HifiGan one" in vocoder_refusal(str(tmp_path / "hifigan"), config)


def test_the_table_picks_the_speecht5_recipe_for_its_text_to_audio():
    config = transformers.SpeechT5Config(architectures=["SpeechT5ForTextToSpeech"])
    assert recipe_for("text-to-audio", config, "onnxruntime") is speecht5_text_to_audio.RECIPE
    assert recipe_for("text-to-audio", transformers.VitsConfig(), "onnxruntime") is not speecht5_text_to_audio.RECIPE


def test_preprocessor_config_is_written_from_a_processor_config_alone(tmp_path):
    """transformers 5's processor_config.json alone: the preprocessor_config.json Transformers.js's
    pipeline loads a processor from, naming SpeechT5Processor; nothing where the source has one
    (copied) or no feature extractor."""
    source, staging = tmp_path / "source", tmp_path / "staging"
    source.mkdir()
    staging.mkdir()
    assert processor_files(source, staging) == []
    settings = {"feature_extractor_type": "SpeechT5FeatureExtractor", "sampling_rate": 16000}
    (source / "processor_config.json").write_text(json.dumps({"feature_extractor": settings}))
    assert processor_files(source, staging) == ["preprocessor_config.json"]
    assert json.loads((staging / "preprocessor_config.json").read_text()) == {**settings, "processor_class": "SpeechT5Processor"}
    (staging / "preprocessor_config.json").unlink()
    (source / "preprocessor_config.json").write_text(json.dumps(settings))
    assert processor_files(source, staging) == [] and not (staging / "preprocessor_config.json").exists()


def _cache_step(path, with_past: bool) -> None:
    # a first step that decodes one frame (its cache of length 1) and a step that appends one to the cache
    value = helper.make_tensor_value_info
    if with_past:
        nodes = [helper.make_node("Concat", ["past_key_values.0.decoder.key", "x"], ["present.0.decoder.key"], axis=2)]
        inputs = [value("x", TensorProto.FLOAT, ["b", 2, 1, 4]), value("past_key_values.0.decoder.key", TensorProto.FLOAT, ["b", 2, "p", 4])]
        output = value("present.0.decoder.key", TensorProto.FLOAT, ["b", 2, "p + 1", 4])
    else:
        nodes = [helper.make_node("Identity", ["x"], ["present.0.decoder.key"])]
        inputs = [value("x", TensorProto.FLOAT, ["b", 2, 1, 4])]
        output = value("present.0.decoder.key", TensorProto.FLOAT, ["b", 2, 1, 4])
    onnx.save(helper.make_model(helper.make_graph(nodes, "step", inputs, [output]), opset_imports=[helper.make_opsetid("", 18)]), path)


def test_the_merged_decoder_keeps_a_self_attention_cache_s_length_free(tmp_path):
    _cache_step(tmp_path / "first.onnx", False)
    _cache_step(tmp_path / "next.onnx", True)
    merge_decoders(tmp_path / "first.onnx", tmp_path / "next.onnx", tmp_path / "merged.onnx", "merged.onnx_data")
    merged = onnx.load(str(tmp_path / "merged.onnx"))
    past = next(v for v in merged.graph.input if v.name == "past_key_values.0.decoder.key")
    assert [d.dim_param or d.dim_value for d in past.type.tensor_type.shape.dim] == ["b", 2, "p", 4]
    session = ort.InferenceSession(str(tmp_path / "merged.onnx"), providers=["CPUExecutionProvider"])
    x, cache = np.ones((1, 2, 1, 4), np.float32), np.zeros((1, 2, 3, 4), np.float32)
    (present,) = session.run(None, {"x": x, "past_key_values.0.decoder.key": cache, USE_CACHE_BRANCH: np.array([True])})
    assert present.shape == (1, 2, 4, 4)
