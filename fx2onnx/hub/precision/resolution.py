"""`export_hf(..., precision=...)`: the precision of a folder's weights.

fp32, fp16 and bf16 are the weights' (and computations') float type, what ``dtype``
says (``dtype`` stays as another name for them). int4 and int8 are weight-only
quantization of a causal LM's linear layers as onnxruntime's ``MatMulNBits``
(`fx2onnx.onnx_passes.weight_quantization`), with float activations: float32 unless
``dtype`` says float16 (onnxruntime's CPU kernel has no bfloat16 form). An encoder's int8
quantizes its activations at run time as well (`export_hf` picks the pass by task).
"""

from __future__ import annotations

import dataclasses

from fx2onnx.onnx_passes import QUANTIZATION_ALGORITHMS, WeightQuantization

FLOAT_PRECISIONS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
QUANTIZED_PRECISIONS = {"int4": 4, "int8": 8}
PRECISIONS = (*QUANTIZED_PRECISIONS, *FLOAT_PRECISIONS)
# export-hf's block scales of int4/int8 causal LMs (WeightQuantization.algorithm)
DEFAULT_ALGORITHM = "rtn"
# export-hf's blocks when no block size is given: the layers' (the builder's CPU default)
# and the LM head's, the largest multiply of a decode step, whose MatMulNBits runs faster
# with bigger blocks (about 20% at K=512: fewer scales to apply per dot product); the
# head's blocks with zero points (the whole 16 codes over each block's range, at no
# measured cost in the kernel), unless a quantized embedding gathers from its codes
DEFAULT_BLOCK_SIZE = 32
DEFAULT_LM_HEAD_BLOCK_SIZE = 128


def resolve_precision(
    precision: str | None,
    dtype: str | None,
    *,
    block_size: int | None = None,
    accuracy_level: int = 4,
    quantize_lm_head: bool = True,
    quantize_embedding: bool = False,
    algorithm: str = DEFAULT_ALGORITHM,
) -> tuple[str | None, WeightQuantization | None]:
    """The model's float dtype (None: the checkpoint's) and the weight quantization (None:
    float weights) that ``precision`` and ``dtype`` ask for; a contradiction is an error.
    A given ``block_size`` is every layer's, the LM head's too (symmetric as the layers);
    None: the defaults above."""
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
        bits=QUANTIZED_PRECISIONS[precision], block_size=block_size or DEFAULT_BLOCK_SIZE,
        lm_head_block_size=None if block_size else DEFAULT_LM_HEAD_BLOCK_SIZE,
        lm_head_symmetric=None if block_size or quantize_embedding else False, accuracy_level=accuracy_level,
        lm_head=quantize_lm_head, embedding=quantize_embedding, algorithm=algorithm,
    )
    return dtype or "float32", quantization


# The projections whose error costs the most (llama.cpp's Q4_K_M rule, which the GenAI
# builder's ``mixed_layers`` follows too): attention's value projection (or the packed
# q/k/v one) and the MLP's down projection.
_SENSITIVE_PROJECTIONS = ("v_proj", "qkv_proj", "down_proj")


def more_bits_layers(num_layers: int) -> list[int]:
    """The decoder layers whose sensitive projections get 8 bits in mixed precision: the
    first and last eighth of the layers, and every third layer between them."""
    eighth = num_layers // 8
    return [i for i in range(num_layers) if i < eighth or i >= num_layers - eighth or (i - eighth) % 3 == 2]


def with_mixed_precision(quantization: WeightQuantization, num_layers: int) -> WeightQuantization:
    """``quantization`` with 8 bits for the value and down projections of the layers
    `more_bits_layers` names (weight names as transformers gives them, ``...layers.<i>.<...>.v_proj.weight``)."""
    patterns = tuple(f"*layers.{layer}.*{projection}.weight" for layer in more_bits_layers(num_layers)
                     for projection in _SENSITIVE_PROJECTIONS)
    return dataclasses.replace(quantization, int8_layers=patterns)
