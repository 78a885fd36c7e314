"""Every wav2vec2-style architecture on a padded batch: HuBERT, WavLM, UniSpeech,
UniSpeechSat, Data2VecAudio, SEW, SEW-D, Wav2Vec2-Conformer and W2V-BERT (wav2vec2 itself
and Parakeet CTC in test_export_hf_padded_audio.py), each with its CTC head or its
audio-classification head (bench/speech_padded_batches.py measures both), tiny (built
from their config classes) with layer norm and saved with a feature extractor that
returns the mask of the padding. Two clips of different lengths as
the extractor pads them give transformers' logits on the same batch, row by row, within
1e-4: a CTC model's at the frames its own rule says the clip fills, a classifier's over
the frames it pools (the padded row's differ from transformers' unmasked ones: the mask is
what makes it exact).

Transformers.js (its pipelines run a batch's clips one at a time): the
`automatic-speech-recognition` pipeline gives transformers' pipeline's text for each clip
(HuBERT: the folder's `tokenizer.json` written for its `Wav2Vec2CTCTokenizer`; Parakeet:
its `ParakeetTokenizer`'s with the CTC decoding transformers does in Python) and the
`audio-classification` pipeline its labels and scores (WavLM, within 1e-4)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.speech.audio_mask import frames_mask_rule
from test_export_hf_padded_audio import _WAV2VEC2, _features, _logits, _varied, clip
from test_export_hf_padded_audio import MODELS as PADDED_AUDIO_MODELS
from test_transformers_js import run_in_transformers_js, transformers_js  # noqa: F401 (fixture)

transformers = pytest.importorskip("transformers")

# a Wav2Vec2CTCTokenizer's vocabulary as released English checkpoints have it: the CTC blank
# (the padding token), the special tokens, the word delimiter, letters and the apostrophe
VOCABULARY = ["<pad>", "<s>", "</s>", "<unk>", "|", *"ETAONIHSRDLUMWCFGYPBVK'XJQZ"]
LABELS = 4
# the tiny wav2vec2 family's settings, with layer norm (the checkpoints whose extractors return the mask)
_TINY = dict(_WAV2VEC2, feat_extract_norm="layer", do_stable_layer_norm=True, classifier_proj_size=16)
# model type -> (its config class, CTC class, classifier class, settings beyond the family's):
# what sizes the tiny model's relative positions (WavLM's buckets, SEW-D's), Data2VecAudio's
# stack of positional convolutions, the Conformer's depthwise convolution
ARCHITECTURES: dict[str, tuple[str, str, str, dict]] = {
    "wav2vec2": ("Wav2Vec2Config", "Wav2Vec2ForCTC", "Wav2Vec2ForSequenceClassification", {}),
    "hubert": ("HubertConfig", "HubertForCTC", "HubertForSequenceClassification", {}),
    "wavlm": ("WavLMConfig", "WavLMForCTC", "WavLMForSequenceClassification", dict(num_buckets=16, max_bucket_distance=40)),
    "unispeech": ("UniSpeechConfig", "UniSpeechForCTC", "UniSpeechForSequenceClassification", {}),
    "unispeech-sat": ("UniSpeechSatConfig", "UniSpeechSatForCTC", "UniSpeechSatForSequenceClassification", {}),
    "data2vec-audio": ("Data2VecAudioConfig", "Data2VecAudioForCTC", "Data2VecAudioForSequenceClassification",
                       dict(num_conv_pos_embeddings=2, conv_pos_kernel_size=5)),
    "sew": ("SEWConfig", "SEWForCTC", "SEWForSequenceClassification", {}),
    "sew-d": ("SEWDConfig", "SEWDForCTC", "SEWDForSequenceClassification", dict(position_buckets=16,
                                                                                 max_position_embeddings=64)),
    "wav2vec2-conformer": ("Wav2Vec2ConformerConfig", "Wav2Vec2ConformerForCTC",
                           "Wav2Vec2ConformerForSequenceClassification", dict(conv_depthwise_kernel_size=3)),
}
_W2V_BERT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                 feature_projection_input_dim=160, output_hidden_size=32, conv_depthwise_kernel_size=3,
                 classifier_proj_size=16)
HEADS = ("ctc", "classifier")


# a Parakeet CTC head's tokenizer: SentencePiece-style pieces (a word's first marked), the blank last
PIECES = ["<unk>", "▁", "▁the", "▁a", "s", "t", "e", "▁cat", "▁sat", "on", "m", "at", "d", "o", "g", "▁dog", "r", "n",
          "i", "<pad>"]


def parakeet_tokenizer():
    """A `ParakeetTokenizer` over PIECES (its backend a `tokenizers` word-level model, the
    Metaspace decoder of the checkpoints' SentencePiece models)."""
    tokenizers = pytest.importorskip("tokenizers")
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({p: i for i, p in enumerate(PIECES)}, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
    backend.decoder = tokenizers.decoders.Metaspace()
    backend.add_special_tokens(["<unk>", "<pad>"])
    return transformers.ParakeetTokenizer(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>")


def tiny_model(model_type: str, head: str, **settings) -> torch.nn.Module:
    """The architecture's tiny model with ``head``, its weights drawn wide (`_varied`);
    ``settings`` over the tiny ones (`feat_extract_norm="group"`)."""
    if model_type == "parakeet_ctc":  # test_export_hf_padded_audio.py's, its blank the tokenizer's
        torch.manual_seed(0)
        model = _varied(PADDED_AUDIO_MODELS["parakeet"][0]())
        model.config.pad_token_id = PIECES.index("<pad>")
        return model
    if model_type == "wav2vec2-bert":
        config_class, ctc, classifier, extra = "Wav2Vec2BertConfig", "Wav2Vec2BertForCTC", \
            "Wav2Vec2BertForSequenceClassification", _W2V_BERT
    else:
        config_class, ctc, classifier, extra = ARCHITECTURES[model_type]
        extra = {**_TINY, **extra}
    head_settings = dict(vocab_size=len(VOCABULARY), pad_token_id=0) if head == "ctc" else dict(num_labels=LABELS)
    config = getattr(transformers, config_class)(**{**extra, **head_settings, **settings})
    torch.manual_seed(0)
    return _varied(getattr(transformers, ctc if head == "ctc" else classifier)(config))


def save_source(folder: Path, model: torch.nn.Module, mask: bool = True) -> None:
    """The model, its feature extractor (returning the mask or not) and, for a CTC head, its tokenizer."""
    model.save_pretrained(folder)
    if model.config.model_type == "parakeet_ctc":
        transformers.ParakeetFeatureExtractor().save_pretrained(folder)
        parakeet_tokenizer().save_pretrained(folder)
        return
    if model.config.model_type == "wav2vec2-bert":
        transformers.SeamlessM4TFeatureExtractor().save_pretrained(folder)
    else:
        transformers.Wav2Vec2FeatureExtractor(return_attention_mask=mask, do_normalize=True).save_pretrained(folder)
    if hasattr(model, "lm_head"):
        (folder / "vocab.json").write_text(json.dumps({c: i for i, c in enumerate(VOCABULARY)}), encoding="utf-8")
        transformers.Wav2Vec2CTCTokenizer(str(folder / "vocab.json")).save_pretrained(folder)


def padded_rows(out: Path, model: torch.nn.Module) -> dict[str, float]:
    """The folder's model on two clips padded together against transformers on the same
    inputs: the largest difference of each row (a CTC model's padded row at the frames
    its clip fills), and that of transformers' padded row without the mask."""
    path = out / "onnx" / "model.onnx"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    features = _features(out, [clip(1.3, 1), clip(0.55, 2)])
    got = session.run(["logits"], {name: features[name] for name in names})[0]
    expected = _logits(model, features)
    found = {"reads_mask": "attention_mask" in names}
    rows = [np.ones(expected.shape[1:2], bool)] * 2 if expected.ndim == 3 else [None] * 2
    if "attention_mask" in features and expected.ndim == 3:
        frames = frames_mask_rule(model)(torch.from_numpy(features["attention_mask"]), expected.shape[1]).bool().numpy()
        rows = [frames[0], frames[1]]
    for index, row in enumerate(rows):
        pick = (lambda x: x[index][row]) if row is not None else (lambda x: x[index])
        found[f"row{index}"] = float(np.abs(pick(got) - pick(expected)).max())
    if "attention_mask" in features:
        unmasked = _logits(model, {name: value for name, value in features.items() if name != "attention_mask"})
        pick = (lambda x: x[1][rows[1]]) if rows[1] is not None else (lambda x: x[1])
        found["unmasked_row1"] = float(np.abs(pick(unmasked) - pick(expected)).max())
    return found


# one head each (bench/speech_padded_batches.py measures both, with group norm and without the mask too):
# wav2vec2's heads and W2V-BERT's CTC head are in test_export_hf_padded_audio.py
CASES = [("hubert", "ctc"), ("wavlm", "classifier"), ("unispeech", "classifier"), ("unispeech-sat", "ctc"),
         ("data2vec-audio", "ctc"), ("sew", "classifier"), ("sew-d", "ctc"), ("wav2vec2-conformer", "classifier"),
         ("wav2vec2-bert", "classifier")]
# two CTC models transcribed (a Wav2Vec2CTCTokenizer's folder, a ParakeetTokenizer's) and a classifier (WavLM's
# CTC head: Transformers.js's speech recognition pipeline has no case for WavLM, lines 33712-33731 of
# dist/transformers.node.mjs 4.3.2)
JS_CASES = [("hubert", "ctc"), ("parakeet_ctc", "ctc"), ("wavlm", "classifier")]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(kind, head) -> the source folder, the folder export-hf writes (with --verify), the
    model and export-hf's result; each exported once."""
    made: dict[tuple[str, str], tuple[Path, Path, torch.nn.Module, object]] = {}

    def folder(kind: str, head: str):
        if (kind, head) not in made:
            root = tmp_path_factory.mktemp(f"{kind}-{head}")
            model = tiny_model(kind, head)
            save_source(root / "source", model)
            made[kind, head] = (root / "source", root / "out", model, export_hf(root / "source", root / "out", verify=True))
        return made[kind, head]

    return folder


@pytest.mark.parametrize(("kind", "head"), CASES)
def test_padded_batch_rows_are_transformers(exported, kind, head):
    _, out, model, result = exported(kind, head)
    assert result.verification.passed, result.verification.summary()
    onnx.checker.check_model(str(out / "onnx" / "model.onnx"), full_check=True)
    found = padded_rows(out, model)
    assert found["reads_mask"]
    assert found["row0"] <= 1e-4 and found["row1"] <= 1e-4, found
    assert found["unmasked_row1"] > 1e-3, found  # the padded row is transformers' because the mask is read


@pytest.mark.parametrize(("kind", "head"), JS_CASES)
def test_transformers_js_pipelines_give_transformers_answers(exported, tmp_path, transformers_js, kind, head):  # noqa: F811
    """Two clips of different lengths through Transformers.js's pipeline give transformers'
    pipeline's text (CTC) or labels and scores (within 1e-4), clip by clip."""
    source, out, _, _ = exported(kind, head)
    clips = [clip(1.3, 1), clip(0.55, 2)]
    task = "automatic-speech-recognition" if head == "ctc" else "audio-classification"
    job = {"folder": str(out), "task": task, "pipeline": {"clips": [c.tolist() for c in clips]}}
    got = run_in_transformers_js(transformers_js, tmp_path, job)["pipeline"]
    expected = transformers.pipeline(task, model=str(source))(clips)
    if head == "ctc":
        assert [row["text"] for row in got] == [row["text"] for row in expected]
        assert all(row["text"] for row in expected)  # a transcription, not blanks only
    else:
        assert [[item["label"] for item in row] for row in got] == [[item["label"] for item in row] for row in expected]
        np.testing.assert_allclose([[item["score"] for item in row] for row in got],
                                   [[item["score"] for item in row] for row in expected], rtol=0, atol=1e-4)
