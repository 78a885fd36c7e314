"""``aten::_conj_physical`` of a real tensor: the tensor itself.

The Hermitian inverse FFTs (``ihfft2``, ``ihfftn``) conjugate their spectrum with
``_conj_physical``; its complex implementation lives with the other complex functions
(:mod:`dispatcher.functions.complex`), and this real one lets real calls of the same
overload resolve (a complex-only entry would leave them with no function).

:data:`CONJUGATE_FUNCTIONS` lists (qualified ATen names, function); the registry adds
them after torchlib's functions.
"""

from __future__ import annotations

from onnxscript import opset18 as op

from dispatcher.function_table import FunctionTable
from onnxscript.function_libs.torch_lib.tensor_typing import TTensor

__all__ = ["CONJUGATE_FUNCTIONS", "CONJUGATE_DOMAIN"]

CONJUGATE_DOMAIN = "pkg.fx2onnx.conjugate"
_TABLE = FunctionTable(CONJUGATE_DOMAIN)

CONJUGATE_FUNCTIONS = _TABLE.entries


@_TABLE.op("aten::_conj_physical")
def conj_physical(self: TTensor) -> TTensor:
    return op.Identity(self)
