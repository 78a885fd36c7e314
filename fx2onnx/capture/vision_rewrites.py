"""torchvision functions as fx2onnx captures them (see :mod:`fx2onnx.capture.library_adapters`).

Each ``name(original)`` returns the function used in place of ``original`` during a
capture. Branches on data-dependent sizes are decided with ``guard_or_false``: with real
sizes (eager) it is the plain comparison, so the original's branch is taken; with an
unknown size (a capture) it is False, the general path, which computes the same result.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false


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
