"""The transformers models whose images keep their height and width static (the example's
size), why, and which step keeps them so: one table, STATIC_IMAGE_SIZES, read by the
capture and by export-hf's check of an image folder after export (a new architecture's
rule is one entry).

Two steps keep sizes static, and each entry names its own (`KeptBy`):

- the capture (`KeptBy.CAPTURE`), asked for every dim dynamic, keeps the images' height and
  width at the example's size and the batch dynamic, with a note saying why. For models
  whose capture at dynamic sizes is itself the trouble: Swin-style layers pad the feature
  map to whole windows (`maybe_pad`), shift the windows only when the map is larger than
  one, and halve it at every stage, so torch.export reasons over nested floor divisions
  and remainders of both sizes for minutes and still follows the example's padding only;
  DepthPro cuts the image into patches at several scales and computes their count and its
  maps' sizes in Python from the image's. Their image processors resize every image to
  one size, so nothing is lost.
- export-hf's folder check (`KeptBy.FOLDER`): the capture runs with the sizes dynamic, but
  the ONNX model computes at the example's size only (a branch on whether the size is a
  whole number of patches, sizes made Python ints). export-hf writes the example's size
  into the folder's ONNX input and its image processor's settings, and says why.

Why a hand table and not a measurement: export-hf already measures what it can before
writing a folder (transformers' own model refusing a second size; a height and width the
capture gave one symbol, for a branch on square images: `SQUARE_IMAGES_REASON`). The
folder entries are models that transformers runs at any size and whose ONNX model, captured
with the sizes dynamic, fails at another: seeing that takes running the ONNX model at a
second size, which `--verify` does but an export cannot always (a fake-mode export has no
weights). Of those, the capture's own warning of branches on the dynamic sizes sees
MobileViT's only. Each entry's `dynamic_capture` says what a capture with the sizes dynamic
gave a tiny model of its architecture (torch 2.13, transformers 5.24).

Knows transformers only by its module, class and model-type names: nothing here imports it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

# an image's (batch, channels, height, width): the dims kept static
_IMAGE_RANK, _SPATIAL_DIMS = 4, (2, 3)

# the reason export-hf gives a folder whose capture gave height and width one symbol (measured)
SQUARE_IMAGES_REASON = ("it takes a branch for square images, so the capture tied the width to the height "
                        "(Dinov2 uses its position embeddings as they are when the image is square and of their size)")


class KeptBy(enum.Enum):
    """The step that keeps an entry's image sizes static."""

    CAPTURE = "capture"  # asked for every dim dynamic, the capture keeps height and width static
    FOLDER = "folder"  # captured dynamic; export-hf writes the example's size into the folder


@dataclass(frozen=True)
class StaticImageSizes:
    """Models that keep their images' height and width at the example's size.

    ``models`` names them as the docs do; ``found_in(model)`` gives what of a model this
    entry matches (a layer's class name, the model's class or model type), None when it
    does not; ``reason`` says why, ``{found}`` standing for that match; ``kept_by`` is the
    step that keeps the sizes; ``dynamic_capture`` says what a capture with the sizes
    dynamic gives (why the entry is needed)."""

    models: str
    found_in: Callable[[Any], str | None]
    reason: str
    kept_by: KeptBy
    dynamic_capture: str

    def why(self, found: str) -> str:
        """The reason, for a model in which ``found_in`` found ``found``."""
        return self.reason.format(found=found)


def _transformers_layer(model: Any, is_layer: Callable[[torch.nn.Module], bool]) -> str | None:
    """The class name of the first transformers module of ``model`` for which ``is_layer``
    holds, or None."""
    if not isinstance(model, torch.nn.Module):
        return None
    for module in model.modules():
        if type(module).__module__.startswith("transformers.") and is_layer(module):
            return type(module).__name__
    return None


def window_padding_layer(model: Any) -> str | None:
    """The class name of the first transformers layer of ``model`` that pads its feature
    map to whole windows (a ``window_size`` and a ``maybe_pad`` method), or None."""
    return _transformers_layer(
        model, lambda module: hasattr(module, "window_size") and callable(getattr(module, "maybe_pad", None)))


def multi_scale_patch_layer(model: Any) -> str | None:
    """The class name of the first transformers layer of ``model`` that cuts its image into
    patches at several scales (DepthPro's encoder: ``scaled_images_ratios`` and a
    config's ``patch_size``), or None."""
    return _transformers_layer(model, lambda module: bool(getattr(module, "scaled_images_ratios", None)) and isinstance(
        getattr(getattr(module, "config", None), "patch_size", None), int))


def _model_named(*names: str) -> Callable[[Any], str | None]:
    """A ``found_in`` matching a transformers model by its class name or its config's model type."""
    def found_in(model: Any) -> str | None:
        kinds = (type(model).__name__, getattr(getattr(model, "config", None), "model_type", None))
        return next((kind for kind in kinds if kind in names), None)
    return found_in


_UNFOLDING = ("its unfolding into patches rounds the feature map's size with Python's int and math.ceil and "
              "resizes it only when that differs")

STATIC_IMAGE_SIZES: tuple[StaticImageSizes, ...] = (
    StaticImageSizes(
        "Swin, Swin V2, Donut's Swin, MaskFormer's Swin, Swin2SR, CLAP's audio Swin", window_padding_layer,
        "pads its feature maps to whole windows ({found}.maybe_pad), and with those sizes dynamic torch.export's "
        "symbolic reasoning over the padding takes minutes and still follows the example's padding only",
        KeptBy.CAPTURE,
        "slow and wrong: a tiny two-stage Swin captures in 100 s (5 s at static sizes), and its ONNX model follows "
        "the example's padding branches only"),
    StaticImageSizes(
        "DepthPro", multi_scale_patch_layer,
        "cuts its image into patches at several scales ({found}) and computes their count and its feature maps' "
        "sizes in Python from the example's size, which a capture follows only",
        KeptBy.CAPTURE,
        "captures, warning of branches on the height at six lines (the patches' count and the merged maps' "
        "sizes); the capture ties its width to its height"),
    StaticImageSizes(
        "Perceiver's convolutional image classifier", _model_named("PerceiverForImageClassificationConvProcessing"),
        "its trained position embeddings are reshaped to the example's grid of convolved features",
        KeptBy.FOLDER,
        "captures without a warning; its ONNX model fails at another size (its position embeddings' Reshape)"),
    StaticImageSizes(
        "MobileViT", _model_named("mobilevit"), _UNFOLDING, KeptBy.FOLDER,
        "captures, warning of branches on the height and width (the unfolding's resize); its ONNX model fails at "
        "another size (a LayerNormalization's features do not match)"),
    StaticImageSizes(
        "MobileViT v2", _model_named("mobilevitv2"), _UNFOLDING, KeptBy.FOLDER,
        "captures without a warning; its ONNX model fails at another size (Col2Im's count of blocks)"),
    StaticImageSizes(
        "Deformable DETR", _model_named("deformable_detr"),
        "its deformable attention splits the values by the feature maps' sizes as a list of Python ints",
        KeptBy.FOLDER,
        "captures without a warning on the height and width; its ONNX model fails at another size (the positions "
        "of one feature map broadcast against another's)"),
)


def static_image_size_reason(model: Any, kept_by: KeptBy) -> str | None:
    """Why ``model``'s images keep the example's height and width at the step ``kept_by``
    (the first entry of STATIC_IMAGE_SIZES kept by it that matches: its reason), or None."""
    for entry in STATIC_IMAGE_SIZES:
        if entry.kept_by is kept_by and (found := entry.found_in(model)) is not None:
            return entry.why(found)
    return None


def _is_image(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == _IMAGE_RANK and value.is_floating_point()


def capture_note(name: str, size: tuple[int, int], model_name: str, why: str) -> str:
    """What the capture says of input ``name`` whose images keep the example's ``size``
    because ``model_name`` ``why`` (an entry's reason)."""
    return (
        f"Input '{name}' keeps its height and width static ({size[0]} x {size[1]}, the example's): {model_name} "
        f"{why}. Its image processor resizes every image to one size: export at that size (the batch stays "
        "dynamic), or pass dynamic_shapes naming the dims to keep them dynamic."
    )


def static_image_sizes_at_capture(
    spec: Any, model: Any, named_inputs: Mapping[str, Any] | None,
) -> tuple[Any, list[str]]:
    """``spec`` (the all-dims-dynamic spec of a capture, by input name) with the height and
    width of ``model``'s images static when an entry kept by the capture matches it, and
    the note that says so (one per input changed); ``spec`` as it is and no note otherwise."""
    if not isinstance(spec, Mapping) or named_inputs is None:
        return spec, []
    why = static_image_size_reason(model, KeptBy.CAPTURE)
    if why is None:
        return spec, []
    changed = dict(spec)
    notes: list[str] = []
    for name, value in named_inputs.items():
        dims = spec.get(name)
        if not _is_image(value) or not isinstance(dims, Mapping) or not any(d in dims for d in _SPATIAL_DIMS):
            continue
        changed[name] = {dim: kind for dim, kind in dims.items() if dim not in _SPATIAL_DIMS}
        notes.append(capture_note(name, (value.shape[2], value.shape[3]), type(model).__name__, why))
    return changed, notes
