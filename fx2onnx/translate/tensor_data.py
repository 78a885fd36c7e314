"""Initializer data that refers to a torch tensor instead of copying it.

Weights stay in their torch storage until serialization asks for bytes, so an export
never holds two copies of a model's parameters.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import torch

from dispatcher import torch_dtype_to_onnx
from fx2onnx.capture.fake_mode import is_fake

# dtypes numpy cannot hold natively: view as an unsigned int of the same width, then
# reinterpret with the ml_dtypes type that onnx_ir uses for them.
_VIEW_AS_UINT = {
    torch.bfloat16: torch.uint16,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e4m3fnuz: torch.uint8,
    torch.float8_e5m2: torch.uint8,
    torch.float8_e5m2fnuz: torch.uint8,
}


def real_view(tensor: torch.Tensor) -> torch.Tensor:
    """A complex tensor as a real one with a trailing dim of 2 (other tensors as they are)."""
    if tensor.is_complex():
        return torch.view_as_real(tensor.resolve_conj())
    return tensor


class WeightDataMissingError(RuntimeError):
    """A weight of a fake-mode program was asked for its data, which it does not have."""


class TorchTensorData(ir.Tensor):
    """An `ir.Tensor` backed by a torch tensor (complex tensors stored as real pairs).

    A FakeTensor (fake mode) gives a tensor with a name, dtype and shape but no data:
    asking for its bytes raises `WeightDataMissingError`.
    """

    def __init__(self, tensor: torch.Tensor, name: str | None = None) -> None:
        tensor = real_view(tensor.detach())
        super().__init__(tensor, dtype=torch_dtype_to_onnx(tensor.dtype), name=name)

    @property
    def has_data(self) -> bool:
        return not is_fake(self.raw)

    def _require_data(self) -> None:
        if not self.has_data:
            raise WeightDataMissingError(
                f"The weight '{self.name}' was exported in fake mode and has no data. Give the real "
                "weights: program.save(path, model_state=<state dict or checkpoint path>), or "
                "program(*inputs, model_state=...) to run it."
            )

    def numpy(self) -> np.ndarray:
        self._require_data()
        raw: torch.Tensor = self.raw
        uint_dtype = _VIEW_AS_UINT.get(raw.dtype)
        if uint_dtype is not None:
            return raw.view(uint_dtype).numpy(force=True).view(self.dtype.numpy())
        return raw.numpy(force=True)

    def __array__(self, dtype=None, copy=None):  # noqa: ANN001 - numpy protocol
        array = self.numpy()
        return array if dtype is None else array.astype(dtype)

    def tobytes(self) -> bytes:
        self._require_data()
        # contiguous() copies only tensors that are not laid out densely already
        raw: torch.Tensor = self.raw.contiguous()
        return raw.reshape(-1).view(torch.uint8).numpy(force=True).tobytes() if raw.numel() else b""


def has_data(tensor: ir.TensorProtocol | None) -> bool:
    """Whether an initializer's tensor holds data (False for fake-mode weights)."""
    return tensor is not None and getattr(tensor, "has_data", True)


def tensor_bytes_view(tensor: torch.Tensor) -> np.ndarray:
    """The bytes of a CPU tensor as a flat uint8 array that shares its memory when the
    tensor is contiguous (a memory-mapped checkpoint stays mapped, nothing is copied)."""
    raw = real_view(tensor.detach()).contiguous()
    if raw.device.type != "cpu":
        raw = raw.cpu()
    if raw.numel() == 0:
        return np.empty(0, dtype=np.uint8)
    return raw.reshape(-1).view(torch.uint8).numpy()
