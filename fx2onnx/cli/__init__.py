"""The command line: `fx2onnx export` and `fx2onnx demo` (`main`: the parser and the
commands). It parses and checks arguments (`specs`, `paths`, `model`), then calls the same
public API a Python user calls (`export`, `demo`); it owns no export logic.
"""
