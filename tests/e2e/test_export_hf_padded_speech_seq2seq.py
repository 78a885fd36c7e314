"""Canary and SeamlessM4T (speech recognition by encoder-decoders whose extractors return the
mask of a padded batch: Parakeet's, SeamlessM4T's) on a padded batch of two clips of
different lengths, as the folder's feature extractor pads them: the folder's encoder gives
transformers' encoder outputs row by row at the frames each clip fills (by the model's own
rule: Parakeet's subsampled lengths, SeamlessM4T's adapter's), within 1e-4, and its greedy
tokens per clip are those of transformers' `generate` on the same batch and on each clip
alone. Without the mask transformers' padded row differs (the mask is what makes it exact).
bench/speech_padded_batches.py --seq2seq measures SeamlessM4T v2 too."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.speech.audio_mask import frames_mask_rule
from test_export_hf_speech_seq2seq import TOKENS, _varied, clip, extracted, folder_greedy, optional_inputs

transformers = pytest.importorskip("transformers")

VOCAB = 64
STEPS = 12
CLIPS = ((2.1, 11), (0.9, 12))


def save_canary(folder: Path) -> torch.nn.Module:
    """A Canary (a one-layer Parakeet encoder of 80 mel bins, a two-layer decoder) with its
    checkpoints' feature extractor, ParakeetFeatureExtractor."""
    encoder = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4, intermediate_size=64,
                   subsampling_conv_channels=16, num_mel_bins=80)
    ids = {k: v for k, v in TOKENS.items() if k != "decoder_start_token_id"}
    decoder = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=4, head_dim=8, max_position_embeddings=128, **ids)
    config = transformers.CanaryConfig(encoder_config=encoder, decoder_config=decoder, vocab_size=VOCAB, **TOKENS)
    model = _varied(transformers.CanaryForConditionalGeneration(config), std=0.5)
    model.save_pretrained(folder)
    transformers.ParakeetFeatureExtractor().save_pretrained(folder)
    return model


def save_seamless_m4t(folder: Path, v2: bool = False) -> torch.nn.Module:
    """A SeamlessM4T (v2) for speech-to-text (a one-layer conformer, its adapter striding by 8,
    a two-layer text decoder) with SeamlessM4TFeatureExtractor (two stacked frames of 80 bins)."""
    config_class, model_class = ((transformers.SeamlessM4Tv2Config, transformers.SeamlessM4Tv2ForSpeechToText) if v2 else
                                 (transformers.SeamlessM4TConfig, transformers.SeamlessM4TForSpeechToText))
    config = config_class(vocab_size=VOCAB, hidden_size=32, encoder_layers=1, encoder_ffn_dim=64, encoder_attention_heads=4,
                          decoder_layers=2, decoder_ffn_dim=64, decoder_attention_heads=4, speech_encoder_layers=1,
                          speech_encoder_attention_heads=4, speech_encoder_intermediate_size=64,
                          conv_depthwise_kernel_size=3, max_position_embeddings=128, **TOKENS)
    model = _varied(model_class(config))  # std 0.5 grows its activations: float32's differences near 1e-4
    model.save_pretrained(folder)
    transformers.SeamlessM4TFeatureExtractor().save_pretrained(folder)
    return model


MODELS = {"canary": save_canary, "seamless_m4t": save_seamless_m4t,
          "seamless_m4t_v2": lambda folder: save_seamless_m4t(folder, v2=True)}


def generated(model: torch.nn.Module, features: dict[str, np.ndarray], steps: int = STEPS) -> list[list[int]]:
    """transformers' greedy tokens of each row (the start token left out)."""
    with torch.no_grad():
        return model.generate(**{k: torch.from_numpy(v) for k, v in features.items()}, do_sample=False,
                              max_new_tokens=steps, min_new_tokens=steps)[:, 1:].tolist()


def padded_batch(out: Path, model: torch.nn.Module, steps: int = STEPS) -> dict:
    """The folder on CLIPS padded together against transformers: the encoder's largest
    difference per row at the frames the clip fills, transformers' padded row without the
    mask against with it, and the greedy tokens (the folder's per row; transformers' on the
    batch and on each clip alone)."""
    clips = [clip(seconds, seed) for seconds, seed in CLIPS]
    features = extracted(out, clips)
    given = {k: torch.from_numpy(v) for k, v in features.items()}
    encoder = ort.InferenceSession(os.fspath(out / "onnx" / "encoder_model.onnx"), providers=["CPUExecutionProvider"])
    names = optional_inputs(encoder)
    hidden = torch.from_numpy(encoder.run(["last_hidden_state"], {k: features[k] for k in names if k in features})[0])
    with torch.no_grad():
        expected = model.get_encoder()(**given).last_hidden_state
        unmasked = model.get_encoder()(**{k: v for k, v in given.items() if k != "attention_mask"}).last_hidden_state
    frames = frames_mask_rule(model)(given["attention_mask"], expected.shape[1]).bool()
    return {
        "encoder_inputs": names,
        "frames": frames.sum(1).tolist(),
        "encoder_rows": [float((hidden[i] - expected[i])[frames[i]].abs().max()) for i in range(len(clips))],
        "unmasked_row1": float((unmasked[1] - expected[1])[frames[1]].abs().max()),
        "tokens": folder_greedy(out, features, steps, model.config.decoder_start_token_id),
        "batch_tokens": generated(model, features, steps),
        "alone_tokens": [generated(model, extracted(out, [c]), steps)[0] for c in clips],
    }


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made = {}

    def folder(kind: str):
        if kind not in made:
            root = tmp_path_factory.mktemp(kind)
            model = MODELS[kind](root / "source")
            made[kind] = (root / "out", model, export_hf(root / "source", root / "out", verify=True, tokens=8))
        return made[kind]

    return folder


@pytest.mark.parametrize("kind", ["canary", "seamless_m4t"])
def test_padded_batch_is_transformers_row_by_row(folders, kind):
    out, model, result = folders(kind)
    assert result.verification.passed and result.verification.tokens_equal, result.verification.summary()
    for name in ("encoder_model.onnx", "decoder_model_merged.onnx"):
        onnx.checker.check_model(os.fspath(out / "onnx" / name), full_check=True)
    found = padded_batch(out, model)
    assert found["encoder_inputs"] == ["input_features", "attention_mask"]  # the mask optional (a default of its name)
    assert found["frames"][1] < found["frames"][0]  # the shorter clip fills fewer of the encoder's frames
    assert max(found["encoder_rows"]) <= 1e-4, found
    assert found["unmasked_row1"] > 1e-3, found  # padding would leak into the short clip's frames without the mask
    assert found["tokens"] == found["batch_tokens"] == found["alone_tokens"], found
    assert len({token for row in found["tokens"] for token in row}) > 2
