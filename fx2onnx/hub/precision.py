"""`export_hf(..., precision=...)`: the precision of a folder's weights.

fp32, fp16 and bf16 are the weights' (and computations') float type, what ``dtype``
says (``dtype`` stays as another name for them). int4 and int8 are weight-only
quantization of a causal LM's linear layers as onnxruntime's ``MatMulNBits``
(`fx2onnx.onnx_passes.weight_quantization`), with float activations: float32 unless
``dtype`` says float16 (onnxruntime's CPU kernel has no bfloat16 form). An encoder's int8
quantizes its activations at run time as well (`export_hf` picks the pass by task).
"""

from __future__ import annotations

from fx2onnx.onnx_passes import WeightQuantization

FLOAT_PRECISIONS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
QUANTIZED_PRECISIONS = {"int4": 4, "int8": 8}
PRECISIONS = (*QUANTIZED_PRECISIONS, *FLOAT_PRECISIONS)


def resolve_precision(
    precision: str | None,
    dtype: str | None,
    *,
    block_size: int = 32,
    accuracy_level: int = 4,
    quantize_lm_head: bool = True,
    quantize_embedding: bool = False,
) -> tuple[str | None, WeightQuantization | None]:
    """The model's float dtype (None: the checkpoint's) and the weight quantization (None:
    float weights) that ``precision`` and ``dtype`` ask for; a contradiction is an error."""
    if precision not in QUANTIZED_PRECISIONS and quantize_embedding:
        raise ValueError("quantize_embedding quantizes the embedding of an int4 or int8 folder: give precision int4 or int8.")
    if precision is None:
        return dtype, None
    if precision in FLOAT_PRECISIONS:
        wanted = FLOAT_PRECISIONS[precision]
        if dtype is not None and dtype != wanted:
            raise ValueError(f"precision {precision} means dtype {wanted}, not {dtype}: give one of the two.")
        return wanted, None
    if precision not in QUANTIZED_PRECISIONS:
        raise ValueError(f"Unknown precision {precision!r}: one of {', '.join(PRECISIONS)}.")
    if dtype == "bfloat16":
        raise ValueError(
            f"precision {precision} computes in float32 or float16 (onnxruntime's MatMulNBits has no bfloat16 CPU kernel): "
            "give dtype float32 or float16, or none (float32)."
        )
    quantization = WeightQuantization(
        bits=QUANTIZED_PRECISIONS[precision], block_size=block_size, accuracy_level=accuracy_level, lm_head=quantize_lm_head,
        embedding=quantize_embedding,
    )
    return dtype or "float32", quantization
