"""A compressed-tensors ``pack-quantized`` checkpoint made here from a float transformers
model (what llm-compressor writes for a W4A16 scheme): each linear layer but the LM head as
``weight_packed`` (int32, eight 4-bit codes a word, the first in the lowest bits, each code
stored plus 8), ``weight_scale`` (``[out, in / group]``), ``weight_shape`` and, asymmetric,
``weight_zero_point`` (packed the same way along the output dim), with the config's
``quantization_config`` saying so. The codes are round-to-nearest, computed here; written
with the checkpoint's own code, independent of fx2onnx's packing."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def _pack_int32(values: torch.Tensor) -> torch.Tensor:
    """Signed 4-bit values [rows, cols] (cols a multiple of 8) as int32 [rows, cols / 8]."""
    unsigned = (values.to(torch.int64) + 8).reshape(values.shape[0], -1, 8)
    words = sum(unsigned[..., i] << (4 * i) for i in range(8))
    return words.to(torch.uint32).view(torch.int32) if hasattr(torch, "uint32") else words.to(torch.int32)


def _quantize(weight: torch.Tensor, group: int, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Signed codes [out, in], scales and zero points [out, in / group] of a weight."""
    out, k = weight.shape
    blocks = weight.reshape(out, k // group, group)
    if symmetric:
        scales = blocks.abs().amax(-1) / 7.5
        zero = None
        codes = torch.round(blocks / scales[..., None]).clamp(-8, 7)
    else:
        low, high = blocks.amin(-1).clamp(max=0), blocks.amax(-1).clamp(min=0)
        scales = (high - low) / 15
        zero = (torch.round(-low / scales) - 8).clamp(-8, 7)
        codes = (torch.round(blocks / scales[..., None]) + zero[..., None]).clamp(-8, 7)
    return codes.reshape(out, k).to(torch.int8), scales, None if zero is None else zero.to(torch.int8)


def save_compressed_tensors(model: torch.nn.Module, folder: Path, group: int = 32, symmetric: bool = True) -> None:
    """Save ``model`` (a float transformers causal LM) to ``folder`` as a compressed-tensors
    int4 checkpoint (see the module docstring)."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)  # config, generation config; the weights are rewritten below
    for stale in folder.glob("*.safetensors*"):
        stale.unlink()
    linears = {name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear) and name != "lm_head"}
    tensors = {}
    for name, tensor in model.state_dict().items():
        module, _, leaf = name.rpartition(".")
        if module in linears and leaf == "weight":
            codes, scales, zero = _quantize(tensor.detach().float(), group, symmetric)
            tensors[f"{module}.weight_packed"] = _pack_int32(codes)
            tensors[f"{module}.weight_scale"] = scales.to(tensor.dtype).contiguous()
            tensors[f"{module}.weight_shape"] = torch.tensor(list(tensor.shape), dtype=torch.int64)
            if zero is not None:
                tensors[f"{module}.weight_zero_point"] = _pack_int32(zero.t().contiguous()).t().contiguous()
        else:
            tensors[name] = tensor.detach().contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "int", "symmetric": symmetric, "strategy": "group",
                            "group_size": group, "dynamic": False, "observer": "minmax"},
                "input_activations": None,
                "output_activations": None,
            }
        },
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
