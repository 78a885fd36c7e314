"""Fused kernels chosen on the FX graph, where the model's intent is still visible.

Pattern matchers on an ONNX graph have to guess attention from a dozen MatMul, Softmax
and Reshape nodes; here `aten.scaled_dot_product_attention` is still one node. Each rule
replaces the nodes of its pattern by an fx2onnx operator (``torch.ops.fx2onnx.*``,
defined in ``operators`` with PyTorch semantics), which the dispatcher translates to one
ONNX kernel (``dispatcher/functions/fused.py``). A node whose conditions do not hold stays
as it is (translated unfused) and the reason is recorded as a note.

One module per rule, named after the kernel it makes, each with a read-only ``match``
(a ``Match``, a ``Refusal`` with its reason, or None) and a ``replace`` that makes the
new calls; ``driver`` holds the table (``RULES``) and does the rest (the uses, the
erasing, the notes); ``matching`` the rules' shared reading of the graph, ``editing``
the one way they make nodes:

- ``group_query_attention``: attention over a KV cache input, with a mask built from the
  model input ``FusionTarget.causal_mask`` names, as onnxruntime's ``GroupQueryAttention``
  (a sliding layer's window, read from its mask by ``window_mask``, as ``local_window_size``);
- ``attention_sinks``: attention with sinks (gpt-oss's eager form) over such a cache, as the
  same kernel with the sinks as its ``head_sink``;
- ``attention``: scaled-dot-product attention as the standard ``Attention`` (opset 23);
- ``rotary_embedding``: ``x * cos + rotate_half(x) * sin``, the halves rotated by half
  tables, or pairs rotated (Cohere's interleaved form), as ``RotaryEmbedding`` (23);
- ``gelu``: ``aten.gelu`` as ``Gelu`` (opset 20);
- ``rms_normalization``: RMS normalization as ``RMSNormalization`` (23);
- ``mixture_of_experts``: experts routed by a softmax's top k (transformers' grouped
  experts with a SwiGLU: gpt-oss, Mixtral, Qwen-MoE) as onnxruntime's ``MoE``.
"""

from fx2onnx.fx_passes.fused_kernels.driver import RULES, fuse_kernels
from fx2onnx.fx_passes.fused_kernels.matching import FUSED_KERNELS_OPSET, FusionTarget

__all__ = ["FUSED_KERNELS_OPSET", "RULES", "FusionTarget", "fuse_kernels"]
