"""An image folder's height and width (hub/shared/image_sizes.py, pipeline_tasks.py), each
piece on a tiny input without an export: dynamic dims told apart from static ones, the
example's size written into the model's input and into the image processor's settings,
and the note export-hf says then (an entry's reason of the capture's table of models
keeping the example's size, or a measured one)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import onnx_ir as ir
import torch

from fx2onnx.capture.library_adapters import SQUARE_IMAGES_REASON, STATIC_IMAGE_SIZES
from fx2onnx.hub import pipeline_tasks
from fx2onnx.hub.shared.image_sizes import (
    PREPROCESSOR_FILE, image_dims, names_image_dims, processor_at_size, static_size_note, write_processor_at_size,
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


def _stand_in(class_name: str, model_type: str, image_size: int) -> torch.nn.Module:
    """An empty module of class ``class_name`` with a config of ``model_type``."""
    module = type(class_name, (torch.nn.Module,), {"__module__": "transformers.models.stand_in.modeling_stand_in"})()
    module.config = SimpleNamespace(model_type=model_type, image_size=image_size)
    return module


def _dynamic_model() -> ir.Model:
    pixels = ir.Value(name="pixel_values", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["s0", 3, "s1", "s2"]))
    out = ir.Value(name="logits", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["s0", 3]))
    node = ir.Node("", "ReduceMean", [pixels], outputs=[out],
                   attributes=[ir.AttrInt64s("axes", [2, 3]), ir.AttrInt64("keepdims", 0)])
    return ir.Model(ir.Graph([pixels], [out], nodes=[node], opset_imports={"": 17}), ir_version=9)


def test_the_folder_note_is_the_entrys_reason(tmp_path: Path) -> None:
    """export-hf's check after export: a folder entry's model keeps the example's size in its
    ONNX input and its image processor's settings, said with the entry's reason; transformers'
    model is not run (no grown example needed)."""
    model = _stand_in("MobileViTV2ForSemanticSegmentation", "mobilevitv2", 64)
    (tmp_path / PREPROCESSOR_FILE).write_text(json.dumps({"do_resize": True, "size": {"shortest_edge": 256}}))
    (tmp_path / "staging").mkdir()
    loaded = SimpleNamespace(model=model, config=model.config, folder=str(tmp_path))
    onnx_model, said = _dynamic_model(), []
    grown = {"pixel_values": torch.zeros(1, 3, 96, 128)}
    assert image_dims(loaded, onnx_model, grown, tmp_path / "staging", said.append) == [PREPROCESSOR_FILE]
    assert list(onnx_model.graph.inputs[0].shape)[1:] == [3, 64, 64]
    (entry,) = [e for e in STATIC_IMAGE_SIZES if e.found_in(model)]
    assert len(said) == 1 and said[0].startswith("pixel_values keeps its height and width static (64 x 64, the example's)")
    assert f"the capture follows the example's only ({entry.reason})" in said[0]
    written = json.loads((tmp_path / "staging" / PREPROCESSOR_FILE).read_text())
    assert written["size"] == {"height": 64, "width": 64}


def test_a_square_symbol_is_measured_with_its_own_reason(tmp_path: Path) -> None:
    model = _stand_in("Dinov2ForImageClassification", "dinov2", 32)
    onnx_model = _dynamic_model()
    pixels = onnx_model.graph.inputs[0]
    pixels.shape = ir.Shape(["s0", 3, "s1", "s1"])
    said: list[str] = []
    loaded = SimpleNamespace(model=model, config=model.config, folder=str(tmp_path))
    assert image_dims(loaded, onnx_model, {"pixel_values": torch.zeros(1, 3, 64, 96)}, tmp_path, said.append) == []
    assert SQUARE_IMAGES_REASON in said[0] and not pipeline_tasks.dynamic_image_dims(onnx_model)


def test_height_and_width_of_one_symbol_are_told_apart() -> None:
    assert pipeline_tasks.square_image_dims(_model("s1", "s1"))
    assert not pipeline_tasks.square_image_dims(_model("s1", "s2"))
    assert not pipeline_tasks.square_image_dims(_model(32, 32))
