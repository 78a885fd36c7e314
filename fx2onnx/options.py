"""Export options."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from diagnostics import DiagnosticOptions
from dispatcher import OnnxRegistry

DEFAULT_REPORT_PATH = "report_dynamo_export.sarif"


@dataclass
class ExportOptions:
    """Options of `fx2onnx.dynamo_export`.

    Attributes:
        dynamic_shapes: True makes every input dim dynamic; a `torch.export` dynamic-shapes
            spec (dict or tuple of `torch.export.Dim`) is taken as it is; False/None: static.
        onnx_registry: where operators find their ONNX functions (user registrations win).
        diagnostic_options: verbosity and warnings-as-errors of the SARIF diagnostics.
        failure_report_path: where the SARIF report goes when the export fails
            (None: no file is written).
        optimize: run onnxscript's optimizer on the result (module functions are kept).
    """

    dynamic_shapes: Any = None
    onnx_registry: OnnxRegistry | None = None
    diagnostic_options: DiagnosticOptions = field(default_factory=DiagnosticOptions)
    failure_report_path: str | os.PathLike | None = DEFAULT_REPORT_PATH
    optimize: bool = False
    fake_context: Any = None
