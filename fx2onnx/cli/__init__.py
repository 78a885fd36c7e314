"""The command line, an application of the public API: `fx2onnx export`, `fx2onnx demo`
and `fx2onnx export-hf` (`main`: the parser and the commands). It parses and checks
arguments (`specs`, `paths`, `model`), then calls the same public API a Python user calls
(`export`, `demo`, and `fx2onnx.hub` for export-hf); it owns no export logic.
"""
