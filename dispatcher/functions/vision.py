"""torchvision's operators as ONNX's: ``torchvision::roi_pool`` and ``ps_roi_align``.

torchlib translates ``torchvision::nms`` (``NonMaxSuppression``) and ``deform_conv2d``
(``DeformConv``, which needs opset 19). This table adds:

- ``roi_align`` is ``RoiAlign``: ``half_pixel`` corners for ``aligned=True``,
  ``output_half_pixel`` otherwise; torchvision's adaptive sampling
  (``sampling_ratio <= 0``) is ONNX's ``sampling_ratio=0``, both
  ``ceil(RoI size / output size)`` points per bin (torchlib's function warns of a
  difference there is not);
- ``roi_pool`` is ``MaxRoiPool`` (both round the RoI's corners to the feature grid and
  take the maximum of each bin; an empty bin gives 0). torchvision also returns the
  position of each maximum, which only its backward pass reads: an export that uses
  it is refused before translation (:data:`UNCOMPUTED_OUTPUTS`).
- ``ps_roi_align`` (position-sensitive): output channel ``c`` of bin ``(i, j)`` is the
  RoI Align (half-pixel corners) of input channel ``(c * ph + i) * pw + j`` on that bin.
  ``RoiAlign`` pools every channel on every bin; the bin's own channel is then read
  (a ``Gather`` of the diagonal), which costs ``ph * pw`` times the pooling work.

Nothing here imports torchvision: the functions are registered by operator name, and
the registry never sees these operators when torchvision is not installed.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import opset18 as op

from dispatcher.function_table import FunctionTable

__all__ = ["VISION_FUNCTIONS", "VISION_DOMAIN", "UNCOMPUTED_OUTPUTS"]

VISION_DOMAIN = "pkg.fx2onnx.vision"
_TABLE = FunctionTable(VISION_DOMAIN)

VISION_FUNCTIONS = _TABLE.entries


def _rois_and_batch_indices(rois):
    """torchvision's (K, 5) RoIs ``[batch index, x1, y1, x2, y2]`` as ONNX's two inputs."""
    boxes = op.Slice(rois, op.Constant(value_ints=[1]), op.Constant(value_ints=[5]), op.Constant(value_ints=[1]))
    first = op.Slice(rois, op.Constant(value_ints=[0]), op.Constant(value_ints=[1]), op.Constant(value_ints=[1]))
    batch = op.Cast(op.Squeeze(first, op.Constant(value_ints=[1])), to=ir.DataType.INT64.value)
    return boxes, batch


@_TABLE.op("torchvision::roi_align")
def roi_align(input, rois, spatial_scale: float, pooled_height: int, pooled_width: int, sampling_ratio: int, aligned: bool):
    # torchvision's sampling_ratio <= 0 and ONNX's 0 both sample ceil(RoI size / output size)
    # points per bin: the same computation, no warning needed (torchlib's function warns)
    boxes, batch = _rois_and_batch_indices(rois)
    return op.RoiAlign(
        input, boxes, batch, mode="avg",
        coordinate_transformation_mode="half_pixel" if aligned else "output_half_pixel",
        output_height=pooled_height, output_width=pooled_width,
        sampling_ratio=max(sampling_ratio, 0), spatial_scale=spatial_scale,
    )


@_TABLE.op("torchvision::roi_pool")
def roi_pool(input, rois, spatial_scale: float, pooled_height: int, pooled_width: int):
    pooled = op.MaxRoiPool(input, rois, pooled_shape=[pooled_height, pooled_width], spatial_scale=spatial_scale)
    # Never read: a graph that reads torchvision's argmax output is refused before
    # translation (UNCOMPUTED_OUTPUTS); -1 is torchvision's mark of an empty bin.
    unread = op.Expand(op.Constant(value_int=-1), op.Shape(pooled))
    return pooled, unread


# Operator outputs these functions do not compute: (qualified name, output index) -> what
# it holds. fx2onnx refuses a graph that reads one, at the user's line.
UNCOMPUTED_OUTPUTS: dict[tuple[str, int], str] = {
    ("torchvision::roi_pool", 1): "the positions of the maxima, which only roi_pool's backward pass reads",
}


@_TABLE.op("torchvision::ps_roi_align")
def ps_roi_align(input, rois, spatial_scale: float, pooled_height: int, pooled_width: int, sampling_ratio: int):
    boxes, batch = _rois_and_batch_indices(rois)
    pooled = op.RoiAlign(
        input, boxes, batch, mode="avg", coordinate_transformation_mode="half_pixel",
        output_height=pooled_height, output_width=pooled_width,
        sampling_ratio=max(sampling_ratio, 0), spatial_scale=spatial_scale,
    )  # (K, C_out * ph * pw, ph, pw)
    bins = pooled_height * pooled_width
    # explicit sizes: a -1 cannot be inferred when there are no RoIs
    count = op.Slice(op.Shape(pooled), op.Constant(value_ints=[0]), op.Constant(value_ints=[1]))
    channels = op.Div(op.Slice(op.Shape(input), op.Constant(value_ints=[1]), op.Constant(value_ints=[2])), op.Constant(value_ints=[bins]))
    flat = op.Reshape(pooled, op.Concat(count, channels, op.Constant(value_ints=[bins * bins]), axis=0))
    diagonal = op.Constant(value_ints=[b * bins + b for b in range(bins)])
    output = op.Reshape(op.Gather(flat, diagonal, axis=2),
                        op.Concat(count, channels, op.Constant(value_ints=[pooled_height, pooled_width]), axis=0))
    # torchvision's second output: the input channel each output value comes from
    mapping = op.Reshape(op.Range(op.Constant(value_int=0), op.Gather(op.Shape(input), op.Constant(value_int=1)), op.Constant(value_int=1)),
                         op.Concat(op.Constant(value_ints=[1]), channels, op.Constant(value_ints=[pooled_height, pooled_width]), axis=0))
    mapping = op.Expand(mapping, op.Shape(output))
    return output, mapping
