"""What `export_hf` was asked for, as one value: the options as given, the dtype and weight
quantization they resolve to, and the combinations of options refused for every folder kind
(before anything is loaded). A recipe checks the rest in its `accepts`, and says what it
refuses as a `Refusal`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from fx2onnx.hub.precision.resolution import DEFAULT_ALGORITHM, resolve_precision
from fx2onnx.onnx_passes import WeightQuantization


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: the error raised (its type and message) before anything is written."""

    error_type: type[Exception]
    message: str

    def error(self) -> Exception:
        return self.error_type(self.message)


@dataclass(frozen=True)
class ExportRequest:
    """`export_hf`'s options (see its docstring); ``dtype`` and ``quantization`` as resolved
    from ``precision`` and ``dtype`` (`resolve`), the quantization then as the folder writes
    it (a pre-quantized checkpoint's codes, mixed precision's layers)."""

    task: str | None = None
    dtype: str | None = None
    fake: bool = False
    verify: bool = False
    opset: int | None = None
    tokens: int = 16
    rtol: float | None = None
    atol: float | None = None
    progress: bool = False
    runtime: str = "onnxruntime"
    module_functions: bool = False
    precision: str | None = None
    block_size: int | None = None
    accuracy_level: int = 4
    quantize_lm_head: bool = True
    quantize_embedding: bool = False
    quantization_algorithm: str = DEFAULT_ALGORITHM
    mixed_precision: bool = False
    pack_projections: bool = False
    text_only: bool = False
    without_audio: bool = False
    float32_twin: bool = False
    vocoder: str | None = None
    quantization: WeightQuantization | None = None

    @classmethod
    def resolve(cls, **options: object) -> ExportRequest:
        """The request of ``options`` with its dtype and quantization resolved; a
        contradiction among the options is an error, nothing loaded or written."""
        request = cls(**options)  # type: ignore[arg-type]
        dtype, quantization = resolve_precision(
            request.precision, request.dtype, block_size=request.block_size, accuracy_level=request.accuracy_level,
            quantize_lm_head=request.quantize_lm_head, quantize_embedding=request.quantize_embedding,
            algorithm=request.quantization_algorithm,
        )
        for refused, message in REFUSED_COMBINATIONS:
            if refused(request):
                raise ValueError(message(request))
        return dataclasses.replace(request, dtype=dtype, quantization=quantization)


# Combinations refused whatever the model: (when, the error's message).
REFUSED_COMBINATIONS: tuple[tuple[Callable[[ExportRequest], bool], Callable[[ExportRequest], str]], ...] = (
    (lambda r: r.quantize_embedding and r.module_functions,
     lambda r: "quantize_embedding quantizes the token embedding's Gather in one flat graph (with module "
               "functions it is inside the embedding's function): drop module_functions."),
    (lambda r: r.pack_projections and r.module_functions,
     lambda r: "pack_projections packs the MatMulNBits of one flat graph (the projections of a layer are "
               "separate module functions otherwise): drop module_functions."),
    (lambda r: r.runtime == "standard" and r.module_functions,
     lambda r: "runtime standard writes one flat graph (OpenVINO and TVM take no ONNX functions): drop module_functions."),
    (lambda r: r.mixed_precision and r.precision != "int4",
     lambda r: f"mixed_precision gives some layers of an int4 folder 8 bits; precision is {r.precision}: give int4."),
    (lambda r: r.mixed_precision and r.module_functions,
     lambda r: "mixed_precision chooses layers of one flat graph by their names: drop module_functions."),
)
