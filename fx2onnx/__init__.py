"""fx2onnx: export PyTorch models to ONNX through their FX graph.

>>> import torch, fx2onnx
>>> model, x = torch.nn.Linear(4, 3), torch.randn(2, 4)
>>> program = fx2onnx.dynamo_export(model, x, export_options=fx2onnx.ExportOptions(
...     dynamic_shapes=True, failure_report_path=None))
>>> torch.testing.assert_close(program(torch.ones(5, 4)), model(torch.ones(5, 4)), rtol=1e-5, atol=1e-5)
>>> program.save("model.onnx")  # doctest: +SKIP
>>> program.save_diagnostics("report.sarif")  # doctest: +SKIP
"""

from diagnostics import DiagnosticOptions
from dispatcher import OnnxRegistry
from fx2onnx.errors import OnnxExporterError, UnsupportedInputError
from fx2onnx.exporter import dynamo_export
from fx2onnx.capture.fake_mode import enable_fake_mode
from fx2onnx.options import ExportOptions, ModuleFunctionOptions, ONNXFakeContext, WeightQuantization
from fx2onnx.program.model_signature import ModelSignature
from fx2onnx.program.onnx_program import ONNXProgram
from fx2onnx.user_warnings import ExportWarning
from fx2onnx.version import __version__

__all__ = [
    "DiagnosticOptions",
    "ExportOptions",
    "ExportWarning",
    "ModelSignature",
    "ModuleFunctionOptions",
    "ONNXFakeContext",
    "ONNXProgram",
    "OnnxExporterError",
    "OnnxRegistry",
    "UnsupportedInputError",
    "WeightQuantization",
    "__version__",
    "dynamo_export",
    "enable_fake_mode",
]
