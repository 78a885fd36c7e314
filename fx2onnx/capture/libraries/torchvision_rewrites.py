"""torchvision functions as fx2onnx captures them (see :mod:`fx2onnx.capture.library_adapters`).

Each ``name(original)`` returns the function used in place of ``original`` during a
capture. Branches on data-dependent sizes are decided with ``guard_or_false``: with real
sizes (eager) it is the plain comparison, so the original's branch is taken; with an
unknown size (a capture) it is False, the general path, which computes the same result.
Sizes computed from a dynamic image size use ``torch.sym_min``/``sym_max`` and integer
arithmetic where torchvision uses Python's ``min`` and ``int()``, which would fix them to
the example's; with real sizes the originals run.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false

from fx2onnx.private_ops import map_function


def batched_nms(original: Any) -> Any:
    """``torchvision.ops.batched_nms``: NMS per class, by moving each class's boxes out
    of the others' way (torchvision's coordinate trick) and one NMS over all boxes.

    torchvision also returns early on no boxes (``boxes.max()`` of nothing fails in
    eager) and runs NMS class by class above 4000 coordinates on the CPU (faster there,
    same boxes kept). Both branches are kept for real sizes; an unknown number of boxes
    takes the general path: in ONNX, no boxes give no offsets and an empty result."""
    from torchvision.ops import boxes as box_ops

    @functools.wraps(original)
    def rewritten(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float) -> torch.Tensor:
        if guard_or_false(boxes.numel() == 0):
            return torch.empty((0,), dtype=torch.int64, device=boxes.device)
        if guard_or_false(boxes.numel() > 4000) and boxes.device.type == "cpu":
            return box_ops._batched_nms_vanilla(boxes, scores, idxs, iou_threshold)
        offsets = idxs.to(boxes) * (boxes.max() + 1)
        return box_ops.nms(boxes + offsets[:, None], scores, iou_threshold)

    return rewritten


def multiscale_roi_align(original: Any) -> Any:
    """``torchvision.ops.poolers._multiscale_roi_align``: RoI Align of each box on the
    feature level its size selects. torchvision counts the boxes with ``len(rois)``,
    which needs a Python int; the rewrite keeps the count symbolic (``rois.shape[0]``)
    and writes each level's results at its boxes' rows, as the original does."""
    from torchvision.ops import poolers, roi_align

    @functools.wraps(original)
    def rewritten(x_filtered: list[torch.Tensor], boxes: list[torch.Tensor], output_size: Any,
                  sampling_ratio: int, scales: Any, mapper: Any) -> torch.Tensor:
        if scales is None or mapper is None or len(x_filtered) == 1:
            return original(x_filtered, boxes, output_size, sampling_ratio, scales, mapper)  # no count taken
        rois = poolers._convert_to_roi_format(boxes)
        levels = mapper(boxes)
        first = x_filtered[0]
        result = first.new_zeros((rois.shape[0], first.shape[1], *output_size))
        for level, (feature, scale) in enumerate(zip(x_filtered, scales)):
            rows = torch.where(levels == level)[0]
            pooled = roi_align(feature, rois[rows], output_size=output_size, spatial_scale=scale, sampling_ratio=sampling_ratio)
            result = result.index_put((rows,), pooled.to(result.dtype))
        return result

    return rewritten


def _bilinear_taps(start: torch.Tensor, end: torch.Tensor, mask_size: int, image_size: int,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Along one axis, for each box (pixels ``start`` to ``end``, inclusive) and each image
    pixel: the two mask cells that a bilinear resize of the mask to the box's length reads
    (``F.interpolate(..., align_corners=False)``), the weight of the second, and whether the
    pixel lies in the box."""
    length = (end - start + 1).clamp(min=1)
    pixel = torch.arange(image_size, device=start.device)
    offset = pixel[None, :] - start[:, None]  # the pixel's place in the resized mask
    inside = (offset >= 0) & (pixel[None, :] <= end[:, None])
    scale = mask_size / length.to(dtype)
    source = ((offset.to(dtype) + 0.5) * scale[:, None] - 0.5).clamp(min=0)
    low = source.to(torch.int64).clamp(max=mask_size - 1)  # pixels outside the box read in range too
    high = (low + 1).clamp(max=mask_size - 1)
    return low, high, source - low.to(dtype), inside


def paste_masks_in_image(original: Any) -> Any:
    """``torchvision.models.detection.roi_heads.paste_masks_in_image``: each box's mask
    resized to the box and pasted into an empty image. torchvision loops over the boxes
    (a data-dependent count) and resizes each to a size read from its box (a Python int);
    the rewrite computes every pixel of every box at once: the two mask rows and columns
    its bilinear resize reads, weighted as ``F.interpolate`` weights them, zero outside the
    box. Memory is a few times that of the result, which holds a full image per box."""
    from torchvision.models.detection import roi_heads

    @functools.wraps(original)
    def rewritten(masks: torch.Tensor, boxes: torch.Tensor, img_shape: tuple[int, int], padding: int = 1) -> torch.Tensor:
        masks, scale = roi_heads.expand_masks(masks, padding=padding)
        boxes = roi_heads.expand_boxes(boxes, scale).to(dtype=torch.int64)
        (image_height, image_width), mask = img_shape, masks[:, 0]
        row_low, row_high, row_weight, in_rows = _bilinear_taps(boxes[:, 1], boxes[:, 3], mask.shape[1], image_height, mask.dtype)
        col_low, col_high, col_weight, in_cols = _bilinear_taps(boxes[:, 0], boxes[:, 2], mask.shape[2], image_width, mask.dtype)

        def columns(index: torch.Tensor) -> torch.Tensor:  # (boxes, mask rows, image columns)
            return mask.gather(2, index[:, None, :].expand(-1, mask.shape[1], -1))

        across = (1 - col_weight[:, None, :]) * columns(col_low) + col_weight[:, None, :] * columns(col_high)

        def rows(index: torch.Tensor) -> torch.Tensor:  # (boxes, image rows, image columns)
            return across.gather(1, index[:, :, None].expand(-1, -1, image_width))

        pasted = (1 - row_weight[:, :, None]) * rows(row_low) + row_weight[:, :, None] * rows(row_high)
        return torch.where(in_rows[:, :, None] & in_cols[:, None, :], pasted, 0.0)[:, None]

    return rewritten


def heatmaps_to_keypoints(original: Any) -> Any:
    """``torchvision.models.detection.roi_heads.heatmaps_to_keypoints``: each box's
    keypoint heatmaps resized (bicubic) to the box's size in pixels, and the place of
    each one's maximum. torchvision loops over the boxes and reads each size as a
    Python int; the rewrite runs the same steps per box in torch's map operator (an
    ONNX ``Scan``; private in torch, reached through :mod:`fx2onnx.private_ops`), where
    each box's size is a size known at run time."""
    import torch.nn.functional as F

    map_over_boxes = map_function()
    if map_over_boxes is None:  # a PyTorch without the map operator (the suite reports it): no rewrite
        return original

    def one_box(heatmaps_and_box: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        heatmaps, box = heatmaps_and_box
        width, height = (box[2] - box[0]).clamp(min=1), (box[3] - box[1]).clamp(min=1)
        map_width = width.ceil().to(torch.int64).item()
        map_height = height.ceil().to(torch.int64).item()
        torch._check(map_width >= 1)
        torch._check(map_height >= 1)
        resized = F.interpolate(heatmaps[:, None], size=(map_height, map_width), mode="bicubic", align_corners=False)
        flat = resized.reshape(heatmaps.shape[0], -1)
        place = flat.argmax(dim=1)
        x = ((place % map_width).float() + 0.5) * (width / map_width) + box[0]
        y = (torch.div(place, map_width, rounding_mode="floor").float() + 0.5) * (height / map_height) + box[1]
        keypoints = torch.stack([x, y, torch.ones_like(x)], dim=1)
        return keypoints, flat.gather(1, place[:, None])[:, 0].float()

    @functools.wraps(original)
    def rewritten(maps: torch.Tensor, rois: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if guard_or_false(rois.shape[0] == 0):  # eager: map cannot run over nothing
            return original(maps, rois)
        return map_over_boxes(one_box, (maps, rois))

    return rewritten


def _symbolic(*sizes: Any) -> bool:
    return any(isinstance(size, torch.SymInt) for size in sizes)


def resize_image_and_masks(original: Any) -> Any:
    """The detection transform's resize (``transform._resize_image_and_masks``): the
    image scaled by ``min(min_size / shorter side, max_size / longer side)``. torchvision
    picks the sides and the scale with Python's ``min``, which fixes a captured image
    size to the example's orientation and scale; ``torch.sym_min`` / ``sym_max`` keep
    them symbolic and are Python's ``min`` / ``max`` for real sizes."""

    @functools.wraps(original)
    def rewritten(image: torch.Tensor, self_min_size: int, self_max_size: int, target: Any = None,
                  fixed_size: Any = None) -> tuple[torch.Tensor, Any]:
        height, width = image.shape[-2:]
        if target is not None or fixed_size is not None or not _symbolic(height, width):
            return original(image, self_min_size, self_max_size, target, fixed_size)
        scale = torch.sym_min(self_min_size / torch.sym_min(height, width), self_max_size / torch.sym_max(height, width))
        resized = torch.nn.functional.interpolate(
            image[None], scale_factor=scale, mode="bilinear", recompute_scale_factor=True, align_corners=False
        )
        return resized[0], target

    return rewritten


def batch_images(original: Any) -> Any:
    """``GeneralizedRCNNTransform.batch_images``: the images padded with zeros to the
    largest height and width rounded up to a multiple of ``size_divisible``, stacked.
    torchvision rounds with ``int(math.ceil(size / stride) * stride)``, which fixes a
    captured size to the example's; integer arithmetic gives the same sizes and keeps
    them symbolic."""

    @functools.wraps(original)
    def rewritten(self: Any, images: list[torch.Tensor], size_divisible: int = 32) -> torch.Tensor:
        if not images or not _symbolic(*(size for image in images for size in image.shape)):
            return original(self, images, size_divisible)
        sizes = [functools.reduce(torch.sym_max, [image.shape[dim] for image in images]) for dim in range(3)]
        channels, height, width = sizes[0], *((size + size_divisible - 1) // size_divisible * size_divisible for size in sizes[1:])
        padded = [
            torch.nn.functional.pad(image, (0, width - image.shape[2], 0, height - image.shape[1], 0, channels - image.shape[0]))
            for image in images
        ]
        return torch.stack(padded)

    return rewritten

