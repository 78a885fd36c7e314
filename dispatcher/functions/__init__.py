"""fx2onnx's own ONNX function libraries: operators torchlib lacks or gets wrong.

Each module (or package) keeps one `FunctionTable` in a domain of its own; the registry
reads every table listed in `dispatcher.registry.OWN_FUNCTION_TABLES` and adds them after
torchlib's. A new library goes here and into that list.
"""
