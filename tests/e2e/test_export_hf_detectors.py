"""`export-hf` object-detection folders of the RT-DETR family (RT-DETR, RT-DETR v2, D-FINE),
tiny checkpoints built here (nothing downloaded), each exported once with `--verify`.

Their code reads the batch with Python's `len` of a tensor and the image's sizes with
`torch_int`, which would fix both to the example's; the capture keeps them symbolic
(fx2onnx/capture/libraries/transformers_query_selection.py). Each folder takes any batch,
height and width: it passes the full ONNX checker and gives transformers' `logits` and
`pred_boxes` in onnxruntime for a batch of images of a third size. Transformers.js's
`pipeline("object-detection")` runs it on two image files of different sizes, one at a time
as that pipeline does: its detections are those its post-processing makes of transformers'
outputs for the pixel values its processor gives (and, for an image already of the
processor's size, transformers' RTDetrImageProcessor gives the same pixel values)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from fx2onnx.hub import export_hf
from test_transformers_js import run_in_transformers_js, transformers_js  # noqa: F401 (fixture)

transformers = pytest.importorskip("transformers")

LABELS = {0: "cat", 1: "dog", 2: "bird", 3: "fish", 4: "horse"}
SIDE = 64  # the processor's image size: a multiple of the largest feature stride, 32
_HEAD = dict(
    encoder_hidden_dim=16, encoder_in_channels=[16, 16, 16], encoder_ffn_dim=32, encoder_attention_heads=2, d_model=16,
    decoder_in_channels=[16, 16, 16], decoder_ffn_dim=32, decoder_attention_heads=2, decoder_layers=2, decoder_n_points=2,
    num_queries=8, id2label=LABELS, label2id={v: k for k, v in LABELS.items()},
)


def _resnet():
    return transformers.RTDetrResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 16, 16], depths=[1, 1, 1, 1],
                                          layer_type="basic", out_indices=[2, 3, 4])


def _hgnet():
    return transformers.HGNetV2Config(
        embedding_size=8, hidden_sizes=[16, 16, 16, 16], depths=[1, 1, 1, 1], stem_channels=[3, 8, 8],
        stage_in_channels=[8, 16, 16, 16], stage_mid_channels=[8, 8, 8, 8], stage_out_channels=[16, 16, 16, 16],
        stage_num_blocks=[1, 1, 1, 1], stage_numb_of_layers=[1, 1, 1, 1], stage_kernel_size=[3, 3, 3, 3],
        out_indices=[2, 3, 4],
    )


# architecture -> (its tiny model, the gain of its weight matrices' random values: standard
# deviation gain / sqrt(fan-in)). Initial weights score every position of the feature maps
# nearly alike, and the queries the encoder's top-k selects would then be decided by float
# rounding: weights that do not. RT-DETR's ResNet shrinks its features (gain 2), D-FINE's
# HGNet aggregates its layers' (gain 1: with 2 its encoder's values reach 1e9).
MODELS = {
    "rt_detr": (lambda: transformers.RTDetrForObjectDetection(transformers.RTDetrConfig(backbone_config=_resnet(), **_HEAD)), 2.0),
    "rt_detr_v2": (lambda: transformers.RTDetrV2ForObjectDetection(
        transformers.RTDetrV2Config(backbone_config=_resnet(), **_HEAD)), 2.0),
    "d_fine": (lambda: transformers.DFineForObjectDetection(transformers.DFineConfig(
        backbone_config=_hgnet(), **_HEAD, depth_mult=0.34, lqe_hidden_dim=8, max_num_bins=8)), 1.0),
}


def tiny_model(name: str) -> torch.nn.Module:
    """The architecture's tiny model, its weight matrices drawn as MODELS says (seeded)."""
    make, gain = MODELS[name]
    torch.manual_seed(0)
    model = make().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:  # a Linear's (out, in), a convolution's (out, in, kernel...)
                parameter.normal_(0, gain * parameter[0].numel() ** -0.5,
                                  generator=torch.Generator().manual_seed(parameter.numel()))
    return model


@pytest.fixture(scope="module", params=list(MODELS))
def exported(request, tmp_path_factory):
    """(model, folder, export) of the architecture's tiny checkpoint with RTDetrImageProcessor's
    settings (the processor its checkpoints ship), exported with --verify and no --task."""
    folder = tmp_path_factory.mktemp(request.param)
    model = tiny_model(request.param)
    model.save_pretrained(folder / "source")
    transformers.RTDetrImageProcessorPil(size={"height": SIDE, "width": SIDE}).save_pretrained(folder / "source")
    result = export_hf(folder / "source", folder / "out", verify=True)
    return model, folder / "out", result


def _dims(value: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def test_folder_takes_any_batch_and_image_size(exported):
    import onnxruntime as ort

    model, folder, result = exported
    assert result.task == "object-detection"
    assert result.verification.passed, result.verification.summary()
    path = folder / "onnx" / "model.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    proto = onnx.load(str(path), load_external_data=False)
    assert [_dims(i) for i in proto.graph.input] == [["batch_size", 3, "height", "width"]]
    assert [o.name for o in proto.graph.output] == ["logits", "pred_boxes"]
    assert [_dims(o)[0] for o in proto.graph.output] == ["batch_size", "batch_size"]
    # neither the verification's batches (2, 3) nor its sizes
    pixels = torch.randn(4, 3, 96, 160, generator=torch.Generator().manual_seed(7))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"pixel_values": pixels.numpy()})))
    with torch.no_grad():
        expected = model(pixel_values=pixels)
    for name, value in got.items():
        want = getattr(expected, name).numpy()
        assert value.shape == want.shape
        np.testing.assert_allclose(value, want, rtol=0, atol=1e-4)
        assert np.abs(want).max() > 1e-2  # not a zero output compared with zero
    assert json.loads((folder / "preprocessor_config.json").read_text())["image_processor_type"] == "RTDetrImageProcessor"


def _transformers_js_detections(logits: np.ndarray, boxes: np.ndarray, threshold: float) -> list[dict]:
    """What Transformers.js's `post_process_object_detection` (DETR's rule) keeps of one image's
    outputs, as its pipeline gives them with `percentage: true`: per query the label of the
    largest logit, unless it is the last (DETR's "no object"), scored by its softmax; the box
    (center, size) as corners, in fractions of the image."""
    kept = []
    for logit, (cx, cy, w, h) in zip(logits, boxes):
        label = int(np.argmax(logit))
        probabilities = np.exp(logit - logit.max())
        probabilities /= probabilities.sum()
        if label == len(logit) - 1 or probabilities[label] < threshold:
            continue
        box = {"xmin": cx - w / 2, "ymin": cy - h / 2, "xmax": cx + w / 2, "ymax": cy + h / 2}
        kept.append({"score": float(probabilities[label]), "label": LABELS[label], "box": box})
    return kept


def test_transformers_js_pipeline_gives_transformers_detections(exported, tmp_path, transformers_js):  # noqa: F811 (fixture)
    from PIL import Image

    model, folder, _ = exported
    generator = np.random.default_rng(0)
    paths = []
    for height, width in ((SIDE, SIDE), (48, 80)):  # the processor's size, and another it resizes
        paths.append(tmp_path / f"{height}x{width}.png")
        Image.fromarray(generator.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(paths[-1])
    threshold = 0.3
    job = {"folder": str(folder), "task": "object-detection",
           "detect": {"images": [str(p) for p in paths], "options": {"threshold": threshold, "percentage": True}}}
    results = run_in_transformers_js(transformers_js, tmp_path, job)["detect"]
    assert len(results) == 2
    processor = transformers.RTDetrImageProcessorPil.from_pretrained(folder)  # the backend without torchvision
    own = processor(Image.open(paths[0]).convert("RGB"), return_tensors="pt")["pixel_values"]
    total = 0
    for index, result in enumerate(results):
        pixels = torch.tensor(result["pixel_values"]["data"], dtype=torch.float32).reshape(result["pixel_values"]["dims"])
        assert list(pixels.shape) == [1, 3, SIDE, SIDE]
        if index == 0:  # no resize: transformers' processor gives the same pixel values
            np.testing.assert_allclose(pixels.numpy(), own.numpy(), rtol=0, atol=1e-6)
        with torch.no_grad():
            expected = model(pixel_values=pixels)
        want = _transformers_js_detections(expected.logits[0].numpy(), expected.pred_boxes[0].numpy(), threshold)
        got = result["detections"]
        assert [d["label"] for d in got] == [d["label"] for d in want]
        np.testing.assert_allclose([d["score"] for d in got], [d["score"] for d in want], rtol=0, atol=1e-4)
        corners = ("xmin", "ymin", "xmax", "ymax")
        np.testing.assert_allclose([[d["box"][k] for k in corners] for d in got],
                                   [[d["box"][k] for k in corners] for d in want], rtol=0, atol=1e-4)
        total += len(got)
    assert total > 0  # detections compared, not two empty lists
