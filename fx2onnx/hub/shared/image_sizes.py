"""An image folder's height and width: dynamic only where transformers' own model runs
images of another size and the capture follows it there.

Some image models compute at one size only (DPT without a backbone reshapes its tokens to
a square grid: a taller than wide image does not fit it, in transformers as in ONNX). Such a
folder must not name its height and width dynamic: export-hf runs the model on images of a
second size (taller and wider by pipeline_tasks.GROWN_IMAGE) before naming them, and where
transformers refuses them writes the example's size into the ONNX input and into
`preprocessor_config.json` (so Transformers.js's image processor resizes every image to it),
and says so. So it does where the capture gave height and width one symbol (a branch for
square images), and for the models that transformers runs at any size but whose capture
follows the example's only: the entries of the capture's table of models keeping the
example's image size (`static_image_size_reason`, kept by `KeptBy.FOLDER`), which says why."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx_ir as ir

from fx2onnx.capture import SQUARE_IMAGES_REASON, KeptBy, static_image_size_reason
from fx2onnx.hub import pipeline_tasks
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.shared.json_files import read_json, write_json_file
from fx2onnx.hub.shared.program_files import fake_inputs, own_forward_failure, quoted_error

PREPROCESSOR_FILE = "preprocessor_config.json"

def refused_image_size(loaded: LoadedModel, grown: dict[str, Any]) -> str | None:
    """transformers' own error on the ``grown`` example (images of a second size), quoted;
    None when its forward runs them (a fake model in its fake mode)."""
    failure = own_forward_failure(
        loaded, fake_inputs(grown, loaded), lambda own: RuntimeError(quoted_error(own, loaded.model)),
        caught=(ValueError, TypeError, RuntimeError), run_fake=True)
    return None if failure is None else str(failure)


def _kept_size_note(size: tuple[int, int], because: str) -> str:
    """What export-hf says of a folder whose images keep the example's ``size``, ``because`` ..."""
    return (
        f"pixel_values keeps its height and width static ({size[0]} x {size[1]}, the example's): {because}. "
        f"{PREPROCESSOR_FILE} says that size, so that Transformers.js's image processor resizes every image to it."
    )


def static_size_note(model_name: str, size: tuple[int, int], grown: tuple[int, int], error: str) -> str:
    """What export-hf says of a folder whose images keep the example's ``size``: transformers'
    model refuses the ``grown`` size with ``error``."""
    return _kept_size_note(
        size, f"transformers' {model_name} itself does not run images of another size ({grown[0]} x {grown[1]}: {error})")


def example_grid_note(model_name: str, size: tuple[int, int], why: str) -> str:
    """What export-hf says of a folder whose images keep the example's ``size`` because the
    capture follows the example's grid only (``why``)."""
    return _kept_size_note(size, f"{model_name} runs other sizes in transformers, but the capture follows the "
                                 f"example's only ({why})")


def processor_at_size(settings: dict[str, Any], height: int, width: int) -> dict[str, Any]:
    """Image processor ``settings`` that resize every image to ``height`` x ``width`` (no
    aspect ratio kept; a center crop, where it crops, of that size too)."""
    changed = {**settings, "do_resize": True, "size": {"height": height, "width": width}}
    if "keep_aspect_ratio" in changed:
        changed["keep_aspect_ratio"] = False
    if changed.get("do_center_crop"):
        changed["crop_size"] = {"height": height, "width": width}
    return changed


def write_processor_at_size(source: Path, staging: Path, height: int, width: int) -> list[str]:
    """The folder's `preprocessor_config.json`: the source's, resizing to ``height`` x
    ``width`` (processor_at_size); nothing where the source has none."""
    path = source / PREPROCESSOR_FILE
    if not path.is_file():
        return []
    return [write_json_file(staging, PREPROCESSOR_FILE, processor_at_size(read_json(path), height, width))]


def image_dims(
    loaded: LoadedModel, model: ir.Model, grown: dict[str, Any], staging: Path, say: Callable[[str], None],
) -> list[str]:
    """Where the export left the height and width of ``model``'s images dynamic: named
    (pipeline_tasks.name_image_dims) when transformers' model runs the ``grown`` example,
    else written as the example's size, in the model and in the image processor's settings,
    and said. Returns the files written."""
    if not pipeline_tasks.dynamic_image_dims(model):
        return []
    name = type(loaded.model).__name__
    why = static_image_size_reason(loaded.model, KeptBy.FOLDER)
    if why is None and pipeline_tasks.square_image_dims(model):
        why = SQUARE_IMAGES_REASON
    grown_size = tuple(grown["pixel_values"].shape[2:])
    height, width = pipeline_tasks.image_size(loaded.config)
    if why is not None:
        note = example_grid_note(name, (height, width), why)
    else:
        error = refused_image_size(loaded, grown)
        if error is None:
            pipeline_tasks.name_image_dims(model)
            return []
        note = static_size_note(name, (height, width), grown_size, error)
    pipeline_tasks.keep_image_size(model, height, width)
    say(note)
    return write_processor_at_size(Path(loaded.folder), staging, height, width)


def names_image_dims(path: Path) -> bool:
    """Whether the ONNX model at ``path`` names the height and width of its ``pixel_values``
    (read without its weights)."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    pixels = next((value for value in proto.graph.input if value.name == "pixel_values"), None)
    dims = [dim.dim_param or dim.dim_value for dim in pixels.type.tensor_type.shape.dim] if pixels is not None else None
    return pipeline_tasks.names_height_and_width(dims)
