"""Image sizes kept static for transformers' shifted-window models (Swin, Swin V2, Donut's
Swin, MaskFormer's Swin, Swin2SR, CLAP's audio Swin) and multi-scale patch encoders (DepthPro).

Their layers pad the feature map to whole windows and the patch grid to whole patches
(`maybe_pad`), shift the windows only when the map is larger than one window, and halve
the map at every stage. With the image's height and width dynamic, torch.export reasons
symbolically over nested floor divisions and remainders of both, which takes minutes even
for a two-stage model (a tiny Swin: 100 s, against 5 s with the sizes static), and the
capture still follows the padding branches of the example's size only: the ONNX model
would then compute something else at sizes that pad otherwise. Their image processors
resize every image to one size, so a capture asked to keep every dim dynamic keeps the
images' height and width at the example's size (the batch stays dynamic) and says so.
DepthPro's patch encoder cuts the image, scaled by each of its `scaled_images_ratios`, into
overlapping patches and merges their features back into maps whose sizes it computes in
Python from the image's (a square root of the patch count, the log2 of the width over its
encoder's grid): a capture follows the example's size only, and its processor resizes every
image to one size as well (1536 pixels).
Knows transformers only by its module names: nothing here imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

# an image's (batch, channels, height, width): the dims kept static
_IMAGE_RANK, _SPATIAL_DIMS = 4, (2, 3)


def window_padding_layer(model: Any) -> str | None:
    """The class name of the first transformers layer of ``model`` that pads its feature
    map to whole windows (a ``window_size`` and a ``maybe_pad`` method), or None."""
    if not isinstance(model, torch.nn.Module):
        return None
    for module in model.modules():
        cls = type(module)
        if (cls.__module__.startswith("transformers.") and hasattr(module, "window_size")
                and callable(getattr(module, "maybe_pad", None))):
            return cls.__name__
    return None


def multi_scale_patch_layer(model: Any) -> str | None:
    """The class name of the first transformers layer of ``model`` that cuts its image into
    patches at several scales (DepthPro's encoder: ``scaled_images_ratios`` and a
    config's ``patch_size``), or None."""
    if not isinstance(model, torch.nn.Module):
        return None
    for module in model.modules():
        cls = type(module)
        if (cls.__module__.startswith("transformers.") and getattr(module, "scaled_images_ratios", None)
                and isinstance(getattr(getattr(module, "config", None), "patch_size", None), int)):
            return cls.__name__
    return None


def _why_static(model: Any) -> str | None:
    """Why ``model``'s image sizes are kept static (its layer named), or None when they are not."""
    layer = window_padding_layer(model)
    if layer is not None:
        return (f"pads its feature maps to whole windows ({layer}.maybe_pad), and with those sizes dynamic "
                "torch.export's symbolic reasoning over the padding takes minutes and still follows the example's "
                "padding only")
    layer = multi_scale_patch_layer(model)
    if layer is not None:
        return (f"cuts its image into patches at several scales ({layer}) and computes their count and its feature "
                "maps' sizes in Python from the example's size, which a capture follows only")
    return None


def _is_image(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == _IMAGE_RANK and value.is_floating_point()


def static_window_image_sizes(
    spec: Any, model: Any, named_inputs: Mapping[str, Any] | None,
) -> tuple[Any, list[str]]:
    """``spec`` (the all-dims-dynamic spec of a capture, by input name) with the height and
    width of ``model``'s images static when it is a shifted-window model, and the note that
    says so (one per input changed); ``spec`` as it is and no note otherwise. So are a
    multi-scale patch encoder's (DepthPro's)."""
    if not isinstance(spec, Mapping) or named_inputs is None:
        return spec, []
    why = _why_static(model)
    if why is None:
        return spec, []
    changed = dict(spec)
    notes: list[str] = []
    for name, value in named_inputs.items():
        dims = spec.get(name)
        if not _is_image(value) or not isinstance(dims, Mapping) or not any(d in dims for d in _SPATIAL_DIMS):
            continue
        changed[name] = {dim: kind for dim, kind in dims.items() if dim not in _SPATIAL_DIMS}
        height, width = value.shape[2], value.shape[3]
        notes.append(
            f"Input '{name}' keeps its height and width static ({height} x {width}, the example's): {type(model).__name__} "
            f"{why}. Its image processor resizes every image to one size: export at that size (the batch stays "
            "dynamic), or pass dynamic_shapes naming the dims to keep them dynamic."
        )
    return changed, notes
