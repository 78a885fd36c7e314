"""`export-hf` text-to-audio (fx2onnx/hub/recipes/text_to_audio.py): a tiny VITS with a
`VitsTokenizer` (nothing downloaded), its task inferred from its class.

The folder's `onnx/model.onnx` takes `input_ids` and `attention_mask` and gives `waveform`
of a length computed from the predicted durations (no length fixed at export), draws the
model's noise (two runs differ), passes the full ONNX checker, and its `--verify` (the
twin without noise against transformers') passes within 1e-4 on two texts. Its
`tokenizer.json` encodes as `VitsTokenizer`, in the `tokenizers` library and in
Transformers.js; Transformers.js's `pipeline("text-to-audio")` on the folder of a checkpoint
whose noise scales are 0 gives transformers' waveforms within 1e-4 and its sampling rate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort
import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.recipes.text_to_audio import weight_differences
from fx2onnx.hub.shared.tokenizer_files import CHECKED_STRINGS, check_encodings, file_encoder
from fx2onnx.hub.tasks import UnsupportedArchitectureError
from test_transformers_js import run_in_transformers_js, transformers_js  # noqa: F401 (fixture)

transformers = pytest.importorskip("transformers")

CHARACTERS = ["<pad>", "<unk>", " ", "'", "-", *"abcdefghijlmnorstuvwxyzé"]
TEXTS = ["Hello, the quick brown fox!", "a café"]
STRINGS = [*CHECKED_STRINGS, *TEXTS, "", "  two words  "]


def _vits(**scales) -> transformers.VitsModel:
    torch.manual_seed(0)
    config = transformers.VitsConfig(
        vocab_size=len(CHARACTERS), hidden_size=16, num_hidden_layers=2, num_attention_heads=2, ffn_dim=32, flow_size=16,
        spectrogram_bins=17, upsample_initial_channel=16, upsample_rates=[4, 4], upsample_kernel_sizes=[8, 8],
        resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1, 3]], duration_predictor_filter_channels=16,
        prior_encoder_num_flows=2, prior_encoder_num_wavenet_layers=2, depth_separable_num_layers=2,
        duration_predictor_num_flows=2, window_size=4, sampling_rate=8000, **scales)
    return transformers.VitsModel(config).eval()


def _source(folder: Path, model: transformers.VitsModel) -> Path:
    model.save_pretrained(folder)
    (folder / "vocab.json").write_text(json.dumps({c: i for i, c in enumerate(CHARACTERS)}), encoding="utf-8")
    transformers.VitsTokenizer(str(folder / "vocab.json"), phonemize=False).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """(model, folder, export) of a VITS with its own noise, exported in fake mode (its weights
    streamed from the checkpoint) with --verify."""
    folder = tmp_path_factory.mktemp("vits")
    model = _vits()
    result = export_hf(_source(folder / "source", model), folder / "out", verify=True, fake=True)
    return model, folder / "out", result


def test_vits_folder_keeps_the_noise_and_verifies_its_quiet_twin(released):
    model, folder, result = released
    assert result.task == "text-to-audio"
    assert {"onnx/model.onnx", "config.json", "tokenizer.json", "tokenizer_config.json"} <= set(result.files)
    assert result.verification.passed and result.verification.max_logit_difference < 1e-4
    path = folder / "onnx" / "model.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    graph = onnx.load(str(path)).graph
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in [*graph.input, *graph.output]}
    assert dims == {"input_ids": ["batch_size", "sequence_length"], "attention_mask": ["batch_size", "sequence_length"],
                    "waveform": ["batch_size", "waveform_length"]}
    assert sum(node.op_type == "RandomNormalLike" for node in graph.node) == 2  # the durations' noise and the prior's
    session = ort.InferenceSession(str(path))
    ids = transformers.AutoTokenizer.from_pretrained(folder)(TEXTS[0], return_tensors="np")
    runs = [session.run(None, {k: ids[k] for k in ("input_ids", "attention_mask")})[0] for _ in range(3)]
    assert all(np.isfinite(run).all() for run in runs)
    assert len({run.tobytes() for run in runs}) == 3  # each run draws its own noise



def test_verify_compares_the_written_weights_with_the_model_s(released, tmp_path):
    """The twin is exported from the real weights: a weight written otherwise (a wrong one streamed) is found."""
    model, folder, _ = released
    path, names = folder / "onnx" / "model.onnx", set(model.state_dict())
    assert weight_differences(path, path, names) == []
    model = onnx.load(str(path))
    weight = next(t for t in model.graph.initializer if t.name.endswith("k_proj.weight"))
    weight.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(weight) + 1, weight.name))
    onnx.save(model, str(tmp_path / "model.onnx"), save_as_external_data=True, location="model.onnx_data")
    assert weight_differences(tmp_path / "model.onnx", path, names) == [weight.name]


def test_vits_tokenizer_json_encodes_as_vits_tokenizer(released, tmp_path, transformers_js):  # noqa: F811 (fixture)
    _, folder, _ = released
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert type(tokenizer).__name__ == "VitsTokenizer"
    assert check_encodings(tokenizer, {"tokenizer.json": file_encoder(folder / "tokenizer.json")}) == []
    encoded = run_in_transformers_js(transformers_js, tmp_path, {"folder": str(folder), "task": "text-to-audio",
                                                                 "strings": STRINGS})["encoded"]
    assert encoded == [tokenizer(text)["input_ids"] for text in STRINGS]


def test_quiet_vits_in_transformers_js_pipeline(tmp_path, transformers_js):  # noqa: F811 (fixture)
    """A checkpoint whose noise scales are 0: Transformers.js's text-to-audio pipeline on a
    padded batch of two texts gives transformers' waveforms and sampling rate."""
    model = _vits(noise_scale=0.0, noise_scale_duration=0.0)
    folder = export_hf(_source(tmp_path / "source", model), tmp_path / "out").folder
    got = run_in_transformers_js(transformers_js, tmp_path, {"folder": str(folder), "task": "text-to-audio",
                                                             "pipeline": {"texts": TEXTS}})["pipeline"]
    batch = transformers.AutoTokenizer.from_pretrained(folder)(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        waveforms = model(**batch).waveform
    assert len(got) == len(TEXTS)
    for audio, expected in zip(got, waveforms):
        assert audio["sampling_rate"] == model.config.sampling_rate
        assert len(audio["audio"]) == expected.shape[-1]
        np.testing.assert_allclose(audio["audio"], expected.numpy(), rtol=0, atol=1e-4)


def test_an_opset_without_onnxruntime_s_random_kernel_is_refused(released, tmp_path):
    """RandomNormalLike's opset 22 version has no onnxruntime kernel: --opset 22 is refused, naming the opset that works."""
    _, folder, _ = released
    with pytest.raises(ValueError, match="RandomNormalLike, whose opset 22 version .* give --opset 21"):
        export_hf(folder.parent / "source", tmp_path / "out", opset=22)
    assert not (tmp_path / "out").exists()


def test_text_to_audio_of_another_architecture_is_refused(tmp_path):
    """A speech model that generates its audio in steps (MusicGen) is refused for the task before its
    weights are loaded, nothing written."""
    text = dict(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, ffn_dim=32, num_codebooks=2)
    config = transformers.MusicgenConfig(
        text_encoder=transformers.T5Config(vocab_size=32, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8).to_dict(),
        audio_encoder=transformers.EncodecConfig(hidden_size=8, num_filters=4, upsampling_ratios=[2], codebook_size=16,
                                                 codebook_dim=8, num_lstm_layers=1).to_dict(),
        decoder=transformers.MusicgenDecoderConfig(**text).to_dict())
    transformers.MusicgenForConditionalGeneration(config).save_pretrained(tmp_path / "source")
    with pytest.raises(UnsupportedArchitectureError, match="writes text-to-audio folders of vits"):
        export_hf(tmp_path / "source", tmp_path / "out")
    assert not (tmp_path / "out").exists()



def test_a_vocoder_given_for_vits_is_refused(tmp_path):
    """--vocoder is SpeechT5's: VITS writes its own waveform, and the option is refused, nothing written."""
    with pytest.raises(ValueError, match="--vocoder is SpeechT5's text-to-audio vocoder; vits"):
        export_hf(_source(tmp_path / "source", _vits()), tmp_path / "out", vocoder=tmp_path / "hifigan")
    assert not (tmp_path / "out").exists()
