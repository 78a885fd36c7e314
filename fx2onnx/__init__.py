"""fx2onnx: export PyTorch models to ONNX through their FX graph.

>>> import fx2onnx
>>> program = fx2onnx.dynamo_export(model, x, export_options=fx2onnx.ExportOptions(dynamic_shapes=True))
>>> program.save("model.onnx")
>>> program(x)                       # runs in onnxruntime
>>> program.save_diagnostics("report.sarif")
"""

__version__ = "0.1.0"

from diagnostics import DiagnosticOptions
from dispatcher import OnnxRegistry
from fx2onnx.errors import OnnxExporterError, UnsupportedInputError
from fx2onnx.exporter import dynamo_export
from fx2onnx.options import ExportOptions, ModuleFunctionOptions
from fx2onnx.program import ONNXProgram

__all__ = [
    "DiagnosticOptions",
    "ExportOptions",
    "ModuleFunctionOptions",
    "ONNXProgram",
    "OnnxExporterError",
    "OnnxRegistry",
    "UnsupportedInputError",
    "__version__",
    "dynamo_export",
]
