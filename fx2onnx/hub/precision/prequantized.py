"""Checkpoints quantized before export (``quantization_config`` in config.json), written
as MatMulNBits with their own integer codes and scales, not quantized again.

Read: compressed-tensors' ``pack-quantized`` int4/int8 weights (what llm-compressor
writes for W4A16 and W8A16 schemes) with a scale per group of inputs, symmetric or with
zero points: transformers loads them on CPU (``CompressedTensorsConfig(dequantize=True)``
gives float weights ``(code - zero_point) * scale``, which the export traces); each
linear layer the checkpoint quantizes then gets, as MatMulNBits' inputs, the codes,
scales and zero points of its ``weight_packed``, ``weight_scale`` and
``weight_zero_point`` (`nbits_packing.pack_codes`), so the runtime's weight is the one
transformers computes, exactly. The layers the checkpoint keeps float (its ``ignore``
list, the LM head as a rule) stay float.

Other ``quant_method``s are refused with what to do: transformers loads GPTQ and AWQ on CPU
only through gptqmodel (and optimum), which PyPI has as a source distribution to compile,
and bitsandbytes' 4-bit NF4/FP4 levels are not the evenly spaced ones MatMulNBits decodes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fx2onnx.onnx_passes import PackedWeight, WeightQuantization, pack_codes

COMPRESSED_TENSORS = "compressed-tensors"
_PACKED_SUFFIXES = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point")


def quant_method(config: Any) -> str | None:
    """The ``quant_method`` of a transformers config's ``quantization_config`` (None: a float checkpoint)."""
    quantization = getattr(config, "quantization_config", None)
    if quantization is None:
        return None
    return quantization.get("quant_method") if isinstance(quantization, dict) else getattr(quantization, "quant_method", None)


def loading_arguments(config: Any) -> dict[str, Any]:
    """What ``from_pretrained`` needs to load the checkpoint as float weights on CPU."""
    method = quant_method(config)
    if method is None:
        return {}
    if str(method) != COMPRESSED_TENSORS:
        raise NotImplementedError(
            f"the checkpoint is quantized with {method}; fx2onnx reads {COMPRESSED_TENSORS} (pack-quantized) checkpoints: "
            f"convert it to that format, or export the float model with --precision int4."
        )
    import transformers

    return {"quantization_config": transformers.CompressedTensorsConfig(dequantize=True)}


@dataclass(frozen=True)
class _Scheme:
    bits: int
    group: int  # inputs sharing a scale
    symmetric: bool


def _scheme(quantization: dict[str, Any]) -> _Scheme:
    if quantization.get("format") != "pack-quantized":
        raise NotImplementedError(
            f"compressed-tensors format {quantization.get('format')!r}: fx2onnx reads pack-quantized int4/int8 weights "
            "(W4A16, W8A16 schemes)."
        )
    groups = list(quantization.get("config_groups", {}).values())
    weights = [group.get("weights") or {} for group in groups]
    if len({json.dumps(w, sort_keys=True) for w in weights}) != 1 or groups[0].get("input_activations"):
        raise NotImplementedError("compressed-tensors: one weight-only scheme for every layer is read (no mixed groups, no activation quantization).")
    scheme = weights[0]
    if scheme.get("type") != "int" or scheme.get("num_bits") not in (4, 8) or scheme.get("strategy") != "group":
        raise NotImplementedError(f"compressed-tensors weights {scheme}: fx2onnx reads int4/int8 with group scales.")
    group = int(scheme.get("group_size") or 0)
    if group < 16 or group & (group - 1):
        raise NotImplementedError(f"compressed-tensors group size {group}: MatMulNBits needs a power of two of at least 16.")
    return _Scheme(int(scheme["num_bits"]), group, bool(scheme.get("symmetric", True)))


def _unpack_int32(words: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Signed codes [rows, count] from int32 words [rows, ...] holding ``32 / bits`` codes each,
    the first in the lowest bits, each stored plus ``2 ** (bits - 1)``."""
    per_word, mask = 32 // bits, (1 << bits) - 1
    shifts = torch.arange(per_word, dtype=torch.int64) * bits
    unsigned = (words.to(torch.int64) & 0xFFFFFFFF)[..., None] >> shifts & mask
    return (unsigned.reshape(words.shape[0], -1)[:, :count] - 2 ** (bits - 1)).to(torch.int8)


class CheckpointCodes:
    """The codes, scales and zero points a compressed-tensors checkpoint holds, by weight name."""

    def __init__(self, folder: Path, quantization: dict[str, Any]) -> None:
        from safetensors import safe_open

        self.scheme = _scheme(quantization)
        self._files: dict[str, Path] = {}
        for path in sorted(folder.glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 - safe_open has no iteration
                    self._files[key] = path

    def quantization(self) -> WeightQuantization:
        """The MatMulNBits settings that keep the checkpoint's codes (accuracy level 4, the
        int4 default: int8 activations in the kernel)."""
        return WeightQuantization(bits=self.scheme.bits, block_size=self.scheme.group, symmetric=self.scheme.symmetric,
                                  codes_of=self.codes_of)

    def codes_of(self, weight: str) -> Callable[[], PackedWeight] | None:
        """For a float weight name (``....q_proj.weight``), what reads its packed inputs; None
        for a weight the checkpoint keeps float."""
        module = weight.removesuffix(".weight")
        if f"{module}.weight_packed" not in self._files:
            return None
        return lambda: self._read(module)

    def _tensor(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(str(self._files[name]), framework="pt") as handle:
            return handle.get_tensor(name)

    def _read(self, module: str) -> PackedWeight:
        bits = self.scheme.bits
        n, k = (int(d) for d in self._tensor(f"{module}.weight_shape"))
        codes = _unpack_int32(self._tensor(f"{module}.weight_packed"), bits, k)
        scales = self._tensor(f"{module}.weight_scale").to(torch.float32).reshape(n, -1)
        zero = None
        if not self.scheme.symmetric:  # packed along the output dim
            zero = _unpack_int32(self._tensor(f"{module}.weight_zero_point").t().contiguous(), bits, n).t().reshape(n, -1)
        return pack_codes(codes, scales, zero, bits, self.scheme.group)


def checkpoint_codes(folder: Path, config: Any) -> CheckpointCodes | None:
    """The pre-quantized weights of the checkpoint in ``folder`` (None: a float checkpoint)."""
    if quant_method(config) is None:
        return None
    loading_arguments(config)  # refuses the methods that do not load on CPU
    quantization = config.quantization_config
    if not isinstance(quantization, dict):
        quantization = quantization.to_dict()
    return CheckpointCodes(folder, quantization)
