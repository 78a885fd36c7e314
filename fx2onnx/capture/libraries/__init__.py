"""What fx2onnx knows of third-party libraries: one module per library and subject.

- transformers: its cache classes as pytrees (`transformers_caches`), what to change
  when one of its models cannot be captured (`transformers_hints`), the names its
  checkpoints give weights (`transformers_checkpoints`), its dynamic rotary embeddings
  computed from each step's positions during a capture (`transformers_rope`), the
  experts of a mixture kept as one module per expert run densely during a capture
  (`transformers_experts`), Mamba's padding mask of the new tokens
  (`transformers_recurrent_masks`), Mamba2-style chunked scans and the chunked gated delta
  rule with a symbolic number of chunks (`transformers_chunked_scans`,
  `transformers_delta_rule_scans`), Mamba's selective scan over a symbolic length from the
  cache's state (`transformers_selective_scans`), which of its image models keep their
  images' height and width static, why and at which step (`transformers_image_sizes`:
  shifted-window models and DepthPro at capture, MobileViT and a few others in export-hf's
  folders), Gemma 3n's audio attention padding its queries to whole chunks whatever their
  count (`transformers_audio_chunks`), RT-DETR-style detectors' batch read as a Python int
  kept symbolic (`transformers_query_selection`), its `torch_int` of an image's size or
  patch grid kept symbolic (`transformers_symbolic_sizes`);
- torchvision: its functions rewritten so that a capture can decide their data-dependent
  branches (`torchvision_rewrites`);
- torchao: weights held as tensor subclasses made plain tensors (`torchao_tensors`).

None of them imports its library: each reads it from ``sys.modules`` when the model has
loaded it. The rest of fx2onnx reaches them through one entry,
:mod:`fx2onnx.capture.library_adapters`; what other stages know of a library (its
operators' ONNX functions, its graphs' patterns) is listed in docs/architecture.md.
"""
