"""`export-hf` pipeline tasks (fx2onnx/hub/pipeline_tasks.py): one tiny architecture per
task, its task inferred from the checkpoint's class, exported once per module.

Each folder's `onnx/model.onnx` keeps the outputs the task's pipelines read, with their
dims named, passes the full ONNX checker and matches transformers in onnxruntime on two
input sizes (the second with a padded row); Transformers.js (Node) loads it as written
and gives transformers' outputs within 1e-4, and its `pipeline("text-classification")`
gives a fine-tuned classifier's labels and scores."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.pipeline_tasks import PIPELINE_TASKS, example_inputs
from fx2onnx.hub.tasks import UnsupportedTaskError
from test_transformers_js import run_in_transformers_js, trained_tokenizer, transformers_js  # noqa: F401 (fixture)

transformers = pytest.importorskip("transformers")

LABELS = {0: "negative", 1: "neutral", 2: "positive"}
TEXTS = ["the quick brown fox", "hello world of onnx models 42", "the lazy dog"]


def _bert(vocab: int = 100, **extra) -> dict:
    return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=vocab,
                max_position_embeddings=64, **extra)


_WAV2VEC2 = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, conv_dim=(16, 16, 16),
                 conv_stride=(5, 4, 4), conv_kernel=(10, 4, 4), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
_VIT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, patch_size=8)

# task -> (the model of a checkpoint fine-tuned for it, the dims its first input and output are named)
MODELS = {
    "text-classification": lambda vocab: transformers.BertForSequenceClassification(
        transformers.BertConfig(**_bert(vocab, id2label=LABELS, label2id={v: k for k, v in LABELS.items()}))),
    "token-classification": lambda vocab: transformers.DistilBertForTokenClassification(transformers.DistilBertConfig(
        dim=32, hidden_dim=64, n_layers=2, n_heads=4, vocab_size=vocab, max_position_embeddings=64, num_labels=5)),
    "question-answering": lambda vocab: transformers.RobertaForQuestionAnswering(
        transformers.RobertaConfig(**_bert(vocab, pad_token_id=0, bos_token_id=1, eos_token_id=2))),
    "fill-mask": lambda vocab: transformers.BertForMaskedLM(transformers.BertConfig(**_bert(vocab))),
    "multiple-choice": lambda vocab: transformers.BertForMultipleChoice(transformers.BertConfig(**_bert(vocab))),
    "object-detection": lambda vocab: transformers.YolosForObjectDetection(
        transformers.YolosConfig(**_VIT, image_size=[32, 48], num_detection_tokens=5, num_labels=4)),
    "image-segmentation": lambda vocab: transformers.SegformerForSemanticSegmentation(transformers.SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2],
        decoder_hidden_size=32, image_size=32, num_labels=3, patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2])),
    "depth-estimation": lambda vocab: transformers.DPTForDepthEstimation(transformers.DPTConfig(
        **{**_VIT, "num_hidden_layers": 4}, image_size=32, backbone_out_indices=[0, 1, 2, 3],
        neck_hidden_sizes=[16, 16, 32, 32], fusion_hidden_size=16)),
    "automatic-speech-recognition": lambda vocab: transformers.Wav2Vec2ForCTC(
        transformers.Wav2Vec2Config(**_WAV2VEC2, vocab_size=20)),
    "audio-classification": lambda vocab: transformers.ASTForAudioClassification(transformers.ASTConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_mel_bins=16, max_length=32,
        patch_size=8, frequency_stride=8, time_stride=8, num_labels=4)),
    "zero-shot-image-classification": lambda vocab: transformers.CLIPModel(transformers.CLIPConfig(
        text_config=_bert(vocab, eos_token_id=2, bos_token_id=1, pad_token_id=0), vision_config={**_VIT, "image_size": 32},
        projection_dim=16)),
}
DIMS = {
    "multiple-choice": ["batch_size", "num_choices", "sequence_length"],
    "zero-shot-image-classification": ["batch_size", "sequence_length"],
    "object-detection": ["batch_size", 3, "height", "width"],  # YOLOS interpolates its position embeddings
    # DPT without a backbone reshapes its tokens to a square grid: transformers runs no other image
    # size than a square one, so the folder keeps the example's (and its image processor resizes to it)
    "depth-estimation": ["batch_size", 3, 32, 32],
}
TEXT_TASKS = ("text-classification", "token-classification", "question-answering", "fill-mask", "multiple-choice")


@pytest.fixture(scope="module")
def tokenizer():
    return trained_tokenizer()


@pytest.fixture(scope="module", params=list(MODELS))
def exported(request, tmp_path_factory, tokenizer):
    """(task, model, folder, export) of the task's tiny checkpoint, exported with --verify
    and no --task: the task is the one its class is made for."""
    task, folder = request.param, tmp_path_factory.mktemp(request.param)
    torch.manual_seed(0)
    model = MODELS[task](len(tokenizer)).eval()
    if task == "depth-estimation":  # DPT's initial weights give depths of 1e-8: weights that do not
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.normal_(0, 0.06, generator=torch.Generator().manual_seed(parameter.numel()))
    model.save_pretrained(folder / "source")
    if task in TEXT_TASKS or task == "zero-shot-image-classification":
        tokenizer.save_pretrained(folder / "source")
    if task == "depth-estimation":  # resizes to 384 x 384 by default, keeping the aspect ratio where asked
        transformers.DPTImageProcessor(keep_aspect_ratio=True).save_pretrained(folder / "source")
    result = export_hf(folder / "source", folder / "out", verify=True)
    return task, model, folder / "out", result


def _dims(value: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def test_task_folder_matches_transformers(exported):
    task, model, folder, result = exported
    assert result.task == task  # inferred from the architecture
    assert result.verification.passed, result.verification.summary()
    path = folder / "onnx" / "model.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    proto = onnx.load(str(path), load_external_data=False)
    assert [o.name for o in proto.graph.output] == [n for n in PIPELINE_TASKS[task].outputs if n in {o.name for o in proto.graph.output}]
    assert {o.name for o in proto.graph.output} <= set(PIPELINE_TASKS[task].outputs) and proto.graph.output
    assert _dims(proto.graph.input[0])[0] == "batch_size"
    if task in DIMS:
        assert _dims(proto.graph.input[0]) == DIMS[task]
    if task == "depth-estimation":  # Transformers.js's image processor resizes every image to the folder's size
        processor = json.loads((folder / "preprocessor_config.json").read_text(encoding="utf-8"))
        assert processor["size"] == {"height": 32, "width": 32} and processor["keep_aspect_ratio"] is False
    if task == "zero-shot-image-classification":  # images batched apart from the texts (one image, every label)
        assert _dims(next(i for i in proto.graph.input if i.name == "pixel_values"))[0] == "image_batch_size"
        assert _dims(next(o for o in proto.graph.output if o.name == "logits_per_image")) == ["image_batch_size", "batch_size"]
    # a third shape, not the verification's: every output within 1e-4 of transformers
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = example_inputs(task, model.config, model, 1)
    inputs = {k: torch.cat([v, v.flip(0)]) if k != "pixel_values" or task != "zero-shot-image-classification" else v
              for k, v in inputs.items()}
    if task == "object-detection":  # any image size
        inputs["pixel_values"] = torch.randn(2, 3, 40, 56)
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, {k: v.numpy() for k, v in inputs.items()})))
    with torch.no_grad():
        expected = model(**inputs)
    for name, value in got.items():
        want = getattr(expected, name).numpy()
        assert value.shape == want.shape
        np.testing.assert_allclose(value, want, rtol=1e-3, atol=1e-4)
        assert np.abs(want).max() > 1e-3  # not a zero output compared with zero


def test_task_folder_in_transformers_js(exported, tmp_path, transformers_js):  # noqa: F811 (fixture)
    """Transformers.js's class for the task loads the folder and gives transformers' outputs."""
    task, model, folder, _ = exported
    if task == "multiple-choice":
        pytest.skip("Transformers.js has no multiple-choice models")
    inputs = example_inputs(task, model.config, model, 1)
    job = {"folder": str(folder), "task": task, "outputs": list(PIPELINE_TASKS[task].outputs),
           "inputs": {name: {"type": "int64" if v.dtype == torch.int64 else "float32", "dims": list(v.shape),
                             "data": v.flatten().tolist()} for name, v in inputs.items()}}
    with torch.no_grad():
        expected = model(**inputs)
    job["outputs"] = [name for name in job["outputs"] if getattr(expected, name, None) is not None]
    outputs = run_in_transformers_js(transformers_js, tmp_path, job)["outputs"]
    for name in job["outputs"]:
        want = getattr(expected, name).numpy()
        assert outputs[name]["dims"] == list(want.shape)
        np.testing.assert_allclose(np.reshape(outputs[name]["data"], want.shape), want, rtol=0, atol=1e-4)


def test_classifier_in_transformers_js_pipeline(exported, tmp_path, transformers_js):  # noqa: F811 (fixture)
    """A fine-tuned classifier's folder in `pipeline("text-classification")`: every label
    of every text, with transformers' softmax scores within 1e-4."""
    task, model, folder, _ = exported
    if task != "text-classification":
        pytest.skip("the text-classification folder's pipeline")
    job = {"folder": str(folder), "task": task, "pipeline": {"texts": TEXTS, "options": {"top_k": None}}}
    got = run_in_transformers_js(transformers_js, tmp_path, job)["pipeline"]
    batch = transformers.AutoTokenizer.from_pretrained(folder)(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        scores = model(**batch).logits.softmax(-1)
    assert len(got) == len(TEXTS)
    for text_scores, ranked in zip(scores, got):
        expected = sorted(((LABELS[i], float(s)) for i, s in enumerate(text_scores)), key=lambda pair: -pair[1])
        assert [entry["label"] for entry in ranked] == [label for label, _ in expected]
        np.testing.assert_allclose([entry["score"] for entry in ranked], [score for _, score in expected], rtol=0, atol=1e-4)


def test_depth_pro_folder_at_the_image_size_its_patches_need(tmp_path, transformers_js):  # noqa: F811 (fixture)
    """DepthPro cuts patches of patch_size pixels from the image at a quarter, half and whole size,
    so it takes no image whose quarter is smaller than a patch: its folder is exported and
    verified on images of 4 x patch_size pixels (its processor's 1536 for 384), its batch
    dynamic (the encoder counts each scale's patches with len(): library_adapters), and in
    Transformers.js's AutoModelForDepthEstimation gives transformers' depth within 1e-4 at
    another batch."""
    torch.manual_seed(0)
    encoder = dict(model_type="dinov2", hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2,
                   patch_size=8)
    model = transformers.DepthProForDepthEstimation(transformers.DepthProConfig(
        patch_size=32, intermediate_hook_ids=[1, 0], intermediate_feature_dims=[16, 16],
        scaled_images_feature_dims=[32, 32, 16], fusion_hidden_size=16, image_model_config=encoder,
        patch_model_config=encoder, fov_model_config=encoder)).eval()
    # its initial head gives depths of up to 800, where float32 PyTorch is itself 5.5e-4 off float64
    # (past atol 1e-4 where a depth is near 0): the head's last layer scaled to depths of up to 8
    with torch.no_grad():
        model.head.layers[4].weight.mul_(0.01)
    model.save_pretrained(tmp_path / "source")
    result = export_hf(tmp_path / "source", tmp_path / "out", verify=True)
    assert result.task == "depth-estimation" and result.verification.passed, result.verification.summary()
    path = tmp_path / "out" / "onnx" / "model.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    graph = onnx.load(str(path), load_external_data=False).graph
    assert [o.name for o in graph.output] == ["predicted_depth"]
    assert _dims(graph.input[0]) == ["batch_size", 3, 128, 128]
    inputs = {"pixel_values": torch.randn(4, 3, 128, 128, generator=torch.Generator().manual_seed(5))}
    job = {"folder": str(tmp_path / "out"), "task": "depth-estimation", "outputs": ["predicted_depth"],
           "inputs": {"pixel_values": {"type": "float32", "dims": list(inputs["pixel_values"].shape),
                                       "data": inputs["pixel_values"].flatten().tolist()}}}
    with torch.no_grad():
        want = model(**inputs).predicted_depth.numpy()
    got = run_in_transformers_js(transformers_js, tmp_path, job)["outputs"]["predicted_depth"]
    assert got["dims"] == list(want.shape) == [4, 256, 256]
    np.testing.assert_allclose(np.reshape(got["data"], want.shape), want, rtol=0, atol=1e-4)
    assert np.abs(want).max() > 1e-3


def test_checkpoint_without_the_task_head_is_refused(tmp_path):
    """A base model asked for text-classification would get a random head: refused,
    naming the task it is made for, and nothing written."""
    transformers.BertModel(transformers.BertConfig(**_bert())).save_pretrained(tmp_path / "source")
    with pytest.raises(UnsupportedTaskError, match=r"BertModel has no text-classification head.*feature-extraction"):
        export_hf(tmp_path / "source", tmp_path / "out", task="text-classification")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"]


def test_task_of_an_architecture_nobody_serves_is_refused(tmp_path):
    transformers.VivitForVideoClassification(transformers.VivitConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, image_size=32, num_frames=4,
        tubelet_size=[2, 16, 16])).save_pretrained(tmp_path / "source")
    with pytest.raises(UnsupportedTaskError, match="video-classification, which export-hf does not serve"):
        export_hf(tmp_path / "source", tmp_path / "out")
    assert not Path(tmp_path / "out").exists()


def test_verify_fails_on_a_planted_error(tmp_path, monkeypatch, capsys):
    """1e-2 added to a fine-tuned classifier folder's logits before the verification runs:
    `--verify` exits 1 and says by how much."""
    import importlib
    import re

    from fx2onnx.cli.main import main
    from test_export_hf import plant_error

    torch.manual_seed(0)
    MODELS["text-classification"](100).save_pretrained(tmp_path / "source")
    module = importlib.import_module("fx2onnx.hub.export_hf")
    verify, planted = module._verify, []

    def verify_with_an_error(loaded, folder, *args, **kwargs):
        planted.extend(plant_error(folder / "onnx" / "model.onnx", 1e-2))
        return verify(loaded, folder, *args, **kwargs)

    monkeypatch.setattr(module, "_verify", verify_with_an_error)
    command = ["export-hf", str(tmp_path / "source"), "--output", str(tmp_path / "out"), "--verify", "--quiet"]
    assert main(command) == 1
    assert planted == ["logits"]
    assert re.search(r"verification failed: largest difference 0\.0\d* \([\d.]+ times the tolerance", capsys.readouterr().err)


def test_fake_mode_float16_folder(tmp_path):
    """A CTC folder built in fake mode (the weights streamed from the checkpoint) in float16
    matches transformers; its waveform input is float32, as Transformers.js's feature extractor
    gives it, cast to float16 by the graph's first node."""
    torch.manual_seed(0)
    MODELS["automatic-speech-recognition"](100).save_pretrained(tmp_path / "source")
    result = export_hf(tmp_path / "source", tmp_path / "out", verify=True, fake=True, dtype="float16")
    assert result.verification.passed, result.verification.summary()
    proto = onnx.load(str(tmp_path / "out" / "onnx" / "model_fp16.onnx"), load_external_data=False)
    assert [(i.name, i.type.tensor_type.elem_type) for i in proto.graph.input] == [("input_values", onnx.TensorProto.FLOAT)]
    assert proto.graph.node[0].op_type == "Cast" and proto.graph.node[0].input == ["input_values"]
    assert [o.name for o in proto.graph.output] == ["logits"]


def _verified_folder(model, tmp_path: Path, task: str) -> Path:
    """The folder's model.onnx of ``model`` exported with --verify (which passes) for the
    task its class is made for, after the full checker."""
    model.save_pretrained(tmp_path / "source")
    result = export_hf(tmp_path / "source", tmp_path / "out", verify=True)
    assert result.task == task
    assert result.verification.passed, result.verification.summary()
    path = tmp_path / "out" / "onnx" / "model.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    return path


# speech models whose spectrogram is given time first, (batch, frames, width): the width is
# what the first layer reads (W2V-BERT's layer norm over 2 stacked frames of 12 mel bins;
# Parakeet's convolutions over the spectrogram as a one-channel image of 16 mel bins)
TIME_FIRST = {
    "wav2vec2-bert": (lambda: transformers.Wav2Vec2BertForCTC(transformers.Wav2Vec2BertConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, feature_projection_input_dim=24,
        output_hidden_size=32, conv_depthwise_kernel_size=3, vocab_size=20)), 24),
    "parakeet": (lambda: transformers.ParakeetForCTC(transformers.ParakeetCTCConfig(vocab_size=20, encoder_config=dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_mel_bins=16,
        subsampling_conv_channels=8, conv_kernel_size=3))), 16),
}


@pytest.mark.parametrize("name", list(TIME_FIRST))
def test_spectrogram_given_time_first(name, tmp_path):
    """A CTC model that reads its spectrogram time first is fed (batch, frames, width) and
    its folder takes any number of frames: transformers' outputs on a third length."""
    import onnxruntime as ort

    make, width = TIME_FIRST[name]
    torch.manual_seed(0)
    model = make().eval()
    with torch.no_grad():  # Parakeet's initial weights give logits of 1e-4: weights that do not
        for parameter in model.parameters():
            parameter.normal_(0, 0.1, generator=torch.Generator().manual_seed(parameter.numel()))
    path = _verified_folder(model, tmp_path, "automatic-speech-recognition")
    proto = onnx.load(str(path), load_external_data=False)
    assert _dims(proto.graph.input[0])[:2] == ["batch_size", "sequence_length"]
    features = torch.randn(2, 173, width, generator=torch.Generator().manual_seed(2))
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input_features": features.numpy()})
    with torch.no_grad():
        want = model(input_features=features).logits.numpy()
    np.testing.assert_allclose(got[0], want, rtol=1e-3, atol=1e-4)
    assert np.abs(want).max() > 1e-3


def test_a_text_encoder_alone_is_exported_as_its_own_class(tmp_path):
    """A T5 encoder checkpoint (T5EncoderModel, no decoder weights) for feature extraction is
    loaded as itself, not as AutoModel's whole encoder-decoder: last_hidden_state as
    transformers gives it."""
    import onnxruntime as ort

    torch.manual_seed(0)
    model = transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)).eval()
    path = _verified_folder(model, tmp_path, "feature-extraction")
    ids = torch.randint(3, 100, (2, 11), generator=torch.Generator().manual_seed(3))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {i.name: (ids if i.name == "input_ids" else torch.ones_like(ids)).numpy() for i in session.get_inputs()}
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state.numpy()
    np.testing.assert_allclose(got["last_hidden_state"], want, rtol=1e-3, atol=1e-4)
