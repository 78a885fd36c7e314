"""The one-pass audio folders (CTC speech recognition, audio classification) on a padded
batch: two clips of different lengths as the folder's feature extractor pads them, with
the mask where it returns one, give transformers' logits on the same batch, row by row
(within 1e-4; a CTC model's at the output frames the clip fills: the others are no
transcription), with module functions on and off (wav2vec2, W2V-BERT and Parakeet). A folder reads the mask where the
extractor returns one (wav2vec2's layer-norm models, W2V-BERT's and Parakeet's
extractors) and not where it returns none (wav2vec2's group-norm models: zeros padded,
unmasked, as transformers reads them). Transformers.js's pipelines run a batch's clips
one by one (their loops over `preparedAudios`): each clip alone through its processor and
the folder gives transformers' logits for the clip alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.speech.audio_mask import frames_mask_rule
from test_transformers_js import run_in_transformers_js, transformers_js  # noqa: F401 (fixture)

transformers = pytest.importorskip("transformers")

_WAV2VEC2 = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, conv_dim=(16, 16, 16),
                 conv_stride=(5, 4, 4), conv_kernel=(10, 4, 4), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
_LAYER_NORM = dict(feat_extract_norm="layer", do_stable_layer_norm=True)


def _wav2vec2_extractor(mask: bool):
    return transformers.Wav2Vec2FeatureExtractor(return_attention_mask=mask, do_normalize=True)


# kind -> (the model, its feature extractor, whether the folder reads the mask)
MODELS = {
    "wav2vec2-layer-norm": (lambda: transformers.Wav2Vec2ForCTC(transformers.Wav2Vec2Config(
        **_WAV2VEC2, **_LAYER_NORM, vocab_size=20)), lambda: _wav2vec2_extractor(True), True),
    "wav2vec2-group-norm": (lambda: transformers.Wav2Vec2ForCTC(transformers.Wav2Vec2Config(**_WAV2VEC2, vocab_size=20)),
                            lambda: _wav2vec2_extractor(False), False),
    "wav2vec2-classifier": (lambda: transformers.Wav2Vec2ForSequenceClassification(transformers.Wav2Vec2Config(
        **_WAV2VEC2, **_LAYER_NORM, num_labels=4)), lambda: _wav2vec2_extractor(True), True),
    "wav2vec2-bert": (lambda: transformers.Wav2Vec2BertForCTC(transformers.Wav2Vec2BertConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, feature_projection_input_dim=160,
        output_hidden_size=32, conv_depthwise_kernel_size=3, vocab_size=20)), transformers.SeamlessM4TFeatureExtractor, True),
    "parakeet": (lambda: transformers.ParakeetForCTC(transformers.ParakeetCTCConfig(vocab_size=20, encoder_config=dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_mel_bins=80,
        subsampling_conv_channels=8, conv_kernel_size=3))), transformers.ParakeetFeatureExtractor, True),
}
CASES = [(kind, False) for kind in MODELS] + [("wav2vec2-layer-norm", True), ("wav2vec2-bert", True), ("parakeet", True)]


def clip(seconds: float, seed: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(int(16000 * seconds))).astype(np.float32)


def _varied(model: torch.nn.Module) -> torch.nn.Module:
    """Weights drawn wider than the initial ones (Parakeet's give logits of 1e-4)."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, 0.1, generator=torch.Generator().manual_seed(parameter.numel()))
    return model.eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    """Each case's model and extractor saved and exported with --verify, once."""
    made = {}
    for kind, functions in CASES:
        make, extractor, _ = MODELS[kind]
        root = tmp_path_factory.mktemp(kind)
        torch.manual_seed(0)
        model = _varied(make())
        model.save_pretrained(root / "source")
        extractor().save_pretrained(root / "source")
        result = export_hf(root / "source", root / "out", verify=True, module_functions=functions)
        made[kind, functions] = (root / "out", model, result)
    return made


def _features(folder: Path, clips: list[np.ndarray]) -> dict[str, np.ndarray]:
    extractor = transformers.AutoFeatureExtractor.from_pretrained(folder)
    features = extractor(clips, sampling_rate=16000, padding=True, return_tensors="np")
    return {name: value.astype(np.int64 if name == "attention_mask" else np.float32) for name, value in features.items()
            if isinstance(value, np.ndarray)}


def _logits(model: torch.nn.Module, features: dict[str, np.ndarray]) -> np.ndarray:
    with torch.no_grad():
        return model(**{name: torch.from_numpy(value) for name, value in features.items()}).logits.numpy()


@pytest.mark.parametrize(("kind", "functions"), CASES)
def test_a_padded_batch_gives_transformers_rows(folders, kind, functions):
    out, model, result = folders[kind, functions]
    assert result.verification.passed, result.verification.summary()
    path = out / "onnx" / "model.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    proto = onnx.load(str(path), load_external_data=False)
    assert bool(proto.functions) is functions
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    assert ("attention_mask" in names) is MODELS[kind][2]
    features = _features(out, [clip(1.3, 1), clip(0.55, 2)])
    assert ("attention_mask" in features) is MODELS[kind][2]
    got = session.run(["logits"], {name: features[name] for name in names})[0]
    expected = _logits(model, features)
    if "attention_mask" in features and expected.ndim == 3:  # CTC: the frames the padded clip fills
        frames = frames_mask_rule(model)(torch.from_numpy(features["attention_mask"]), expected.shape[1]).bool().numpy()
        assert frames[0].all() and not frames[1].all()
        got, expected = got[frames], expected[frames]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)
    if "attention_mask" in features:  # the padded row is transformers' because the mask is read
        unmasked = _logits(model, {name: value for name, value in features.items() if name != "attention_mask"})
        if unmasked.ndim == 3:
            unmasked = unmasked[frames]
        assert np.abs(unmasked - expected).max() > 1e-3


@pytest.mark.parametrize("kind", ["wav2vec2-layer-norm", "wav2vec2-classifier"])
def test_transformers_js_runs_each_clip_alone(folders, tmp_path, transformers_js, kind):  # noqa: F811 (fixture)
    """Transformers.js's processor gives the mask (ones) the folder reads, and each clip
    alone gives transformers' logits for it alone."""
    out, model, _ = folders[kind, False]
    clips = [clip(1.3, 1), clip(0.55, 2)]
    task = "automatic-speech-recognition" if kind != "wav2vec2-classifier" else "audio-classification"
    job = {"folder": str(out), "task": task, "audio": {"clips": [c.tolist() for c in clips], "outputs": ["logits"]}}
    results = run_in_transformers_js(transformers_js, tmp_path, job)["audio"]
    for samples, result in zip(clips, results):
        assert result["inputs"] == ["attention_mask", "input_values"]
        logits = result["outputs"]["logits"]
        expected = _logits(model, _features(out, [samples]))
        np.testing.assert_allclose(np.reshape(logits["data"], logits["dims"]), expected, rtol=0, atol=1e-4)
