"""Stage 4, ONNX passes: from a translated model to a valid, fast one.

Takes the `ir.Model`; gives it with types onnxruntime's kernels accept (`legalize_types`,
`runtime_kernels`), optimized (`optimization`, `layout_rules`) and validated by ONNX's
checker and strict inference (`validate_model`). Weights without data (fake mode) are
hidden from the passes and the checker (`fake_weights`). The opset the user asks for is
reached last, before validation (`opset_conversion`); then the fused kernels, written
in a domain of their own until the opset is final, join the standard domain
(`fused_kernels`). On request, linear layers become onnxruntime's weight-only
`MatMulNBits` (`weight_quantization`), whose codes are computed from each weight when the
model is written (`derived_weights`). The passes run in the order of `ONNX_PASS_STEPS`,
the stage's entry `run_onnx_passes` (`onnx_pass_steps`).
"""
