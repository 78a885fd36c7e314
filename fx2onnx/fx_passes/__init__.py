"""Stage 2, FX passes: from the captured graph to one the translator can take.

Takes the captured GraphModule; gives it decomposed where no ONNX function covers an
operator (`decompose_unsupported`; the few nodes whose ONNX function computes otherwise:
`node_decompositions`), checked (`capture_checks`), with effect tokens,
assertions and identity views removed, leftover in-place ops functionalized, type
promotion made explicit, the fused kernels the opset has chosen where the model's intent
is still one node (`fused_kernels`: attention, rotary embedding, GELU, RMS norm), and module calls
grouped into nested GraphModules (`modularize`). The passes run in the order of
`FX_PASS_STEPS`, the stage's entry `run_fx_passes` (`fx_pass_steps`).
"""

from fx2onnx.fx_passes.fused_kernels import FUSED_KERNELS_OPSET

__all__ = ["FUSED_KERNELS_OPSET"]
