"""Image folders whose height and width are named dynamic run at every size
(hub/shared/image_sizes.py, capture/libraries/transformers_symbolic_sizes.py).

A tiny Depth Anything (which sizes its depth map with Python's `int` of the patch grid) keeps
its height and width dynamic: `--verify` compares it at a second height and width, and it
matches transformers at a third. A folder that names the sizes dynamic but computes at the
example's fails `--verify`, saying which output has which shape."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from fx2onnx.hub import export_hf
from fx2onnx.hub.recipes.pipeline_task import verify_task_outputs
from fx2onnx.hub.shared.verification import DEFAULT_TOLERANCES

transformers = pytest.importorskip("transformers")


def _depth_anything() -> torch.nn.Module:
    backbone = transformers.Dinov2Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4, patch_size=14, image_size=56,
        out_features=["stage1", "stage2", "stage3", "stage4"], reshape_hidden_states=False)
    config = transformers.DepthAnythingConfig(
        backbone_config=backbone, reassemble_hidden_size=32, neck_hidden_sizes=[16, 16, 32, 32], fusion_hidden_size=16,
        head_hidden_size=16, patch_size=14)
    torch.manual_seed(0)
    model = transformers.DepthAnythingForDepthEstimation(config).eval()
    with torch.no_grad():  # weights that give depths well above zero
        for parameter in model.parameters():
            parameter.normal_(0, 0.1, generator=torch.Generator().manual_seed(parameter.numel()))
    return model


@pytest.fixture(scope="module")
def depth_anything(tmp_path_factory):
    folder = tmp_path_factory.mktemp("depth-anything")
    model = _depth_anything()
    model.save_pretrained(folder / "source")
    return model, folder / "out", export_hf(folder / "source", folder / "out", verify=True)


def test_depth_anything_runs_at_every_size(depth_anything) -> None:
    model, folder, result = depth_anything
    # compared at 224 x 224 (its config names no image size) and 256 x 288 (a depth map of whole patches, 252 x 280)
    assert result.verification.passed, result.verification.summary()
    path = folder / "onnx" / "model.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    pixels = onnx.load(str(path), load_external_data=False).graph.input[0]
    assert [d.dim_param or d.dim_value for d in pixels.type.tensor_type.shape.dim] == ["batch_size", 3, "height", "width"]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for height, width in ((70, 42), (112, 84)):
        images = torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(height))
        (got,) = session.run(None, {"pixel_values": images.numpy()})
        with torch.no_grad():
            want = model(pixel_values=images).predicted_depth.numpy()
        assert got.shape == want.shape == (2, height, width)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
        assert np.abs(want).max() > 1e-2


def test_a_folder_computing_at_the_example_size_fails_verification(depth_anything, tmp_path) -> None:
    """The same folder's depth map sliced to the example's size whatever the input's (as the
    capture made it before Depth Anything's `int` was kept symbolic): --verify names the shapes."""
    model, folder, _ = depth_anything
    proto = onnx.load(str(folder / "onnx" / "model.onnx"))
    graph = proto.graph
    (output,) = graph.output
    inner = output.name + "_full"
    for node in graph.node:
        node.output[:] = [inner if name == output.name else name for name in node.output]
    graph.initializer.extend([onnx.numpy_helper.from_array(np.array(v, dtype=np.int64), n) for n, v in
                              (("starts", [0, 0]), ("ends", [224, 224]), ("axes", [1, 2]))])
    graph.node.append(onnx.helper.make_node("Slice", [inner, "starts", "ends", "axes"], [output.name]))
    onnx.save(proto, str(tmp_path / "model.onnx"))
    verdict = verify_task_outputs(tmp_path / "model.onnx", model, "depth-estimation", model.config,
                                  DEFAULT_TOLERANCES[torch.float32])
    assert not verdict.passed
    assert verdict.failure.startswith("the predicted_depth is [3, 224, 224] where transformers' is [3, 252, 280]")
