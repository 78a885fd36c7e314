"""Weights given apart from the graph: a state dict or a checkpoint file, read lazily.

`open_model_state` accepts
- a mapping of names to tensors (`model.state_dict()`);
- a path to a `.safetensors` file, read tensor by tensor through `safetensors.safe_open`;
- a path to a `torch.save` file, loaded with ``mmap=True, weights_only=True`` so that its
  tensors stay on disk until they are read.

Names are the model's parameter and buffer names (`encoder.layer.0.weight`). A checkpoint
that wraps its state dict (`{"state_dict": {...}}`, `{"model_state_dict": {...}}`) is
unwrapped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, Union

import torch

ModelState = Union[Mapping[str, torch.Tensor], str, os.PathLike]

_WRAPPER_KEYS = ("state_dict", "model_state_dict", "model")


class WeightSource(Protocol):
    """Where the tensors of a model's state come from."""

    def names(self) -> list[str]: ...

    def get(self, name: str) -> torch.Tensor: ...


class _MappingSource:
    def __init__(self, mapping: Mapping[str, Any], origin: str) -> None:
        self._mapping = mapping
        self._origin = origin

    def names(self) -> list[str]:
        return list(self._mapping)

    def get(self, name: str) -> torch.Tensor:
        # Checked when read: a lazy mapping is never read whole.
        value = self._mapping[name]
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"model_state ({self._origin}) must map parameter and buffer names to tensors; "
                f"'{name}' is a {type(value).__name__}."
            )
        return value


class _SafetensorsSource:
    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def names(self) -> list[str]:
        return list(self._handle.keys())

    def get(self, name: str) -> torch.Tensor:
        return self._handle.get_tensor(name)


def _unwrap(loaded: Any, path: str) -> Mapping[str, Any]:
    if isinstance(loaded, torch.nn.Module):
        return loaded.state_dict()
    if not isinstance(loaded, Mapping):
        raise TypeError(f"The checkpoint '{path}' holds a {type(loaded).__name__}, not a state dict.")
    for key in _WRAPPER_KEYS:
        inner = loaded.get(key)
        if isinstance(inner, Mapping) and not any(isinstance(v, torch.Tensor) for v in loaded.values()):
            return inner
    return loaded


@contextmanager
def open_model_state(model_state: ModelState) -> Iterator[WeightSource]:
    """The tensors of ``model_state``, opened for the time of the `with` block."""
    if isinstance(model_state, Mapping):
        yield _MappingSource(model_state, "a mapping")
        return
    if not isinstance(model_state, (str, os.PathLike)):
        raise TypeError(
            "model_state must be a state dict (model.state_dict()) or the path of a checkpoint "
            f"(.safetensors or a torch.save file); got {type(model_state).__name__}."
        )
    path = os.fspath(model_state)
    if not Path(path).is_file():
        raise FileNotFoundError(f"The checkpoint '{path}' given as model_state does not exist or is not a file.")
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(path, framework="pt", device="cpu") as handle:
            yield _SafetensorsSource(handle)
        return
    try:
        loaded = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as error:  # the checkpoint's own error, told with its path
        raise ValueError(
            f"The checkpoint '{path}' could not be loaded with torch.load(mmap=True, weights_only=True): "
            f"{error}. Give a torch.save file of a state dict, a .safetensors file, or the state dict itself."
        ) from error
    yield _MappingSource(_unwrap(loaded, path), f"the checkpoint '{path}'")


def _listing(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def describe_name_mismatch(missing: list[str], unexpected: list[str], hint: str = "") -> str:
    """The message of a model_state whose names do not fit the model's."""
    parts = []
    if missing:
        parts.append(f"missing {len(missing)} tensor(s) the model needs: {_listing(sorted(missing))}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected name(s) the model does not have: {_listing(sorted(unexpected))}")
    return "model_state does not fit the exported model: " + "; ".join(parts) + ". Nothing was written." + hint
