"""The precisions a folder kind writes, as data its recipe declares (`PrecisionSupport`),
checked against a request before anything is exported (`precision_refusal`), and the
weight quantization the folder is then written with (`folder_quantization`: a
pre-quantized checkpoint's own codes, mixed precision's 8-bit layers)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.precision.prequantized import checkpoint_codes
from fx2onnx.hub.precision.resolution import DEFAULT_ALGORITHM, resolve_precision, with_mixed_precision
from fx2onnx.hub.request import ExportRequest, Refusal
from fx2onnx.hub.shared.program_files import weights_dtype
from fx2onnx.onnx_passes import WeightQuantization


@dataclass(frozen=True)
class PrecisionSupport:
    """What a recipe writes besides float weights.

    Attributes:
        weight_only: int4 and int8 as weight-only ``MatMulNBits`` (with every option of
            `WeightQuantization`), pre-quantized checkpoints and mixed precision.
        dynamic_int8_tasks: the tasks whose int8 is ``MatMulInteger`` of activations
            quantized at run time (float32, one flat graph, no other quantization option).
    """

    weight_only: bool = False
    dynamic_int8_tasks: tuple[str, ...] = ()


FLOAT_ONLY = PrecisionSupport()


def precision_refusal(loaded: LoadedModel, request: ExportRequest, support: PrecisionSupport) -> Refusal | None:
    """Why ``request``'s precision cannot be written for ``loaded`` by a recipe with
    ``support`` (None: it can)."""
    return (_quantization_refusal(loaded, request, support) or _prequantized_refusal(loaded, request, support)
            or _mixed_precision_refusal(loaded, request, support))


def _quantization_refusal(loaded: LoadedModel, request: ExportRequest, support: PrecisionSupport) -> Refusal | None:
    quantization, precision = request.quantization, request.precision
    if quantization is None or support.weight_only:
        return None
    if loaded.task not in support.dynamic_int8_tasks:
        return Refusal(NotImplementedError,
            f"precision {precision} is written for causal LMs (int4, int8) and text encoders (int8); {loaded.task} "
            "folders are float: give precision fp32, fp16 or bf16."
        )
    if quantization.embedding:
        return Refusal(NotImplementedError,
            "quantize_embedding is for causal LMs (GatherBlockQuantized beside MatMulNBits); an encoder's int8 keeps "
            "its embeddings float: drop quantize_embedding."
        )
    _, plain = resolve_precision(precision, None, quantize_embedding=quantization.embedding, algorithm=quantization.algorithm)
    if quantization != plain:
        return Refusal(ValueError,
            "block_size, accuracy_level and quantize_lm_head are MatMulNBits' (causal LMs); an encoder's int8 takes "
            "none of them: drop them."
        )
    if quantization.bits != 8:
        return Refusal(NotImplementedError,
            f"precision {precision} for an encoder: its int8 quantizes activations at run time (onnxruntime's "
            "MatMulInteger), which has no 4-bit form; give precision int8."
        )
    if weights_dtype(loaded) != torch.float32:
        return Refusal(ValueError,
            f"precision int8 for an encoder computes in float32 (onnxruntime's DynamicQuantizeLinear takes float32 "
            f"only), not {weights_dtype(loaded)}: give dtype float32 or none."
        )
    return None


def _prequantized_refusal(loaded: LoadedModel, request: ExportRequest, support: PrecisionSupport) -> Refusal | None:
    """A pre-quantized checkpoint is written with its own codes: options that would quantize otherwise are refused."""
    given = checkpoint_codes(loaded.folder, loaded.config)
    if given is None:
        return None
    bits = given.scheme.bits
    if not support.weight_only:
        return Refusal(NotImplementedError,
                       f"pre-quantized checkpoints are exported for causal LMs (MatMulNBits); this one is {loaded.task}.")
    if (request.precision not in (None, f"int{bits}") or request.mixed_precision
            or request.quantization_algorithm != DEFAULT_ALGORITHM):
        return Refusal(ValueError,
            f"the checkpoint is already quantized to {bits} bits and is written with its own codes: give no precision "
            f"(or int{bits}), no mixed_precision and no quantization_algorithm."
        )
    return None


def _mixed_precision_refusal(loaded: LoadedModel, request: ExportRequest, support: PrecisionSupport) -> Refusal | None:
    if request.mixed_precision and not support.weight_only:
        return Refusal(NotImplementedError,
                       f"mixed_precision is for causal LMs' MatMulNBits; {loaded.task} has none: drop it.")
    return None


def folder_quantization(loaded: LoadedModel, request: ExportRequest) -> WeightQuantization | None:
    """The weight quantization of an accepted request's folder: the checkpoint's own codes
    when it is pre-quantized, mixed precision's layers when asked, else the request's."""
    quantization = request.quantization
    given = checkpoint_codes(loaded.folder, loaded.config)
    if given is not None:
        quantization = dataclasses.replace(given.quantization(), accuracy_level=request.accuracy_level)
    if request.mixed_precision:
        assert quantization is not None
        quantization = with_mixed_precision(quantization, int(loaded.config.num_hidden_layers))
    return quantization
