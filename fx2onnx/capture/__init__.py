"""Stage 1, capture: from what the user gave to a graph with FakeTensor metadata.

Takes an `nn.Module`, a plain function, an `ExportedProgram` or a `GraphModule` with
example inputs and `ExportOptions.dynamic_shapes`; gives a `CapturedModel` (an
ExportedProgram from torch.export, or an aten-level GraphModule). The steps run in the
order of `CAPTURE_STEPS`, the stage's entry `capture` (`capture_steps`). Here live:
torch.export under the capture's switches (`torch_export`), its attempts in order
(`capture_strategies`), what a capture tells the user (`capture_reports`), fake mode (`fake_mode`), everything about dynamic dims
(`dynamic_dims`: the spec, its check after capture, the names dims get in ONNX), library adapters active
during a capture (`library_adapters`: transformers' caches in `containers`, torchvision's
data-dependent helpers in `vision_rewrites`) and the hints for failed captures (`hints`,
`transformers_hints`).
"""
