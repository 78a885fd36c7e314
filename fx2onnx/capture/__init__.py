"""Stage 1, capture: from what the user gave to a graph with FakeTensor metadata.

Takes an `nn.Module`, a plain function, an `ExportedProgram` or a `GraphModule` with
example inputs and `ExportOptions.dynamic_shapes`; gives a `CapturedModel` (an
ExportedProgram from torch.export, or an aten-level GraphModule). The steps run in the
order of `CAPTURE_STEPS`, the stage's entry `capture` (`capture_steps`). Here live:
torch.export under the capture's switches (`torch_export`), its attempts in order
(`capture_strategies`), what a capture tells the user (`capture_reports`), fake mode
(`fake_mode`), everything about dynamic dims (`dynamic_dims`: the spec, its check after
capture, the names dims get in ONNX), what fx2onnx knows of third-party libraries
(`libraries`, one module per library, reached through its one entry `library_adapters`:
transformers' caches, hints, checkpoint names and per-module experts, torchvision's data-dependent helpers,
torchao's tensor subclasses) and the hints for failed captures (`hints`; the model's line that
branches on a tensor's value, `value_branches`).
"""

from fx2onnx.capture.dynamic_dims.check import FIXED_DIM
from fx2onnx.capture.dynamic_dims.signature import bound_arguments
from fx2onnx.capture.dynamic_dims.spec import dims_dynamic_but_ones
from fx2onnx.capture.dynamic_dims.switches import sizes_kept_apart
from fx2onnx.capture.fake_mode import fake_copy
from fx2onnx.capture.hints import signature_text
from fx2onnx.capture.library_adapters import (
    SQUARE_IMAGES_REASON, KeptBy, checkpoint_conversions, checkpoint_renaming, default_scan_chunks,
    experts_fake_tensors_run, frozen_numbers, is_cache_type, is_encoder_decoder_cache_type, registered_containers,
    static_image_size_reason, tensors_outside_layers,
)
from fx2onnx.capture.torch_export import model_name
from fx2onnx.capture.value_branches import failing_line, value_branch

__all__ = [
    "FIXED_DIM", "SQUARE_IMAGES_REASON", "KeptBy", "bound_arguments", "checkpoint_conversions", "checkpoint_renaming",
    "default_scan_chunks", "dims_dynamic_but_ones", "experts_fake_tensors_run", "failing_line", "fake_copy", "frozen_numbers",
    "is_cache_type", "is_encoder_decoder_cache_type", "model_name", "registered_containers", "signature_text", "sizes_kept_apart", "static_image_size_reason",
    "tensors_outside_layers", "value_branch",
]
