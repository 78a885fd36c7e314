"""An image folder's height and width (hub/shared/image_sizes.py, pipeline_tasks.py), each
piece on a tiny input without an export: dynamic dims told apart from static ones, the
example's size written into the model's input and into the image processor's settings,
and the note export-hf says then."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import onnx_ir as ir

from fx2onnx.hub import pipeline_tasks
from fx2onnx.hub.shared.image_sizes import (
    PREPROCESSOR_FILE, names_image_dims, processor_at_size, static_size_note, write_processor_at_size,
)


def _model(height: object, width: object) -> ir.Model:
    pixels = ir.Value(name="pixel_values", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["s0", 3, height, width]))
    out = ir.Value(name="logits", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["s0", 3, height, width]))
    node = ir.Node("", "Identity", [pixels], outputs=[out])
    return ir.Model(ir.Graph([pixels], [out], nodes=[node], opset_imports={"": 18}), ir_version=9)


def test_dynamic_dims_named_or_written_as_the_example_size(tmp_path: Path) -> None:
    dynamic, static = _model("s1", "s2"), _model(32, 48)
    assert pipeline_tasks.dynamic_image_dims(dynamic) and not pipeline_tasks.dynamic_image_dims(static)
    pipeline_tasks.name_image_dims(dynamic)
    assert [str(d) for d in dynamic.graph.inputs[0].shape] == ["s0", "3", "height", "width"]
    ir.save(dynamic, tmp_path / "dynamic.onnx")
    assert names_image_dims(tmp_path / "dynamic.onnx")
    assert pipeline_tasks.keep_image_size(dynamic, 32, 48)
    assert list(dynamic.graph.inputs[0].shape)[2:] == [32, 48] and not pipeline_tasks.dynamic_image_dims(dynamic)
    ir.save(dynamic, tmp_path / "static.onnx")
    assert not names_image_dims(tmp_path / "static.onnx")


def test_the_example_size_is_the_configs() -> None:
    assert pipeline_tasks.image_size(SimpleNamespace(image_size=[32, 48])) == (32, 48)
    assert pipeline_tasks.image_size(SimpleNamespace(vision_config=SimpleNamespace(image_size=64))) == (64, 64)
    assert pipeline_tasks.image_size(SimpleNamespace()) == (224, 224)


def test_the_processor_resizes_to_the_example_size(tmp_path: Path) -> None:
    dpt = {"do_resize": True, "size": {"height": 384, "width": 384}, "keep_aspect_ratio": True, "ensure_multiple_of": 1}
    assert processor_at_size(dpt, 32, 48) == {**dpt, "size": {"height": 32, "width": 48}, "keep_aspect_ratio": False}
    vit = {"do_resize": False, "size": {"shortest_edge": 256}, "do_center_crop": True,
           "crop_size": {"height": 224, "width": 224}}
    assert processor_at_size(vit, 32, 32) == {"do_resize": True, "size": {"height": 32, "width": 32}, "do_center_crop": True,
                                              "crop_size": {"height": 32, "width": 32}}
    source, staging = tmp_path / "source", tmp_path / "staging"
    source.mkdir(), staging.mkdir()
    assert write_processor_at_size(source, staging, 32, 32) == [] and not (staging / PREPROCESSOR_FILE).exists()
    (source / PREPROCESSOR_FILE).write_text(json.dumps(dpt), encoding="utf-8")
    assert write_processor_at_size(source, staging, 32, 48) == [PREPROCESSOR_FILE]
    assert json.loads((staging / PREPROCESSOR_FILE).read_text(encoding="utf-8"))["size"] == {"height": 32, "width": 48}


def test_the_note_says_the_size_kept_and_why() -> None:
    note = static_size_note("DPTForDepthEstimation", (32, 32), (64, 96), "RuntimeError: shape '[3, 9, 9, 32]' is invalid")
    assert "static (32 x 32" in note and "(64 x 96: RuntimeError" in note and PREPROCESSOR_FILE in note


def test_a_model_the_capture_follows_at_the_example_grid_only_is_named_with_its_reason() -> None:
    from fx2onnx.hub.shared.image_sizes import EXAMPLE_GRID_MODEL_TYPES, example_grid_note

    note = example_grid_note("MobileViTForSemanticSegmentation", (64, 64), EXAMPLE_GRID_MODEL_TYPES["mobilevit"])
    assert "static (64 x 64" in note and "math.ceil" in note and PREPROCESSOR_FILE in note


def test_height_and_width_of_one_symbol_are_told_apart() -> None:
    assert pipeline_tasks.square_image_dims(_model("s1", "s1"))
    assert not pipeline_tasks.square_image_dims(_model("s1", "s2"))
    assert not pipeline_tasks.square_image_dims(_model(32, 32))
