"""Weights given apart from the graph: a state dict, a checkpoint file or folder, read lazily.

`open_model_state` accepts
- a mapping of names to tensors (`model.state_dict()`);
- a path to a `.safetensors` file, read tensor by tensor through `safetensors.safe_open`
  (memory-mapped);
- a path to a `torch.save` file (`pytorch_model.bin` too), loaded with ``mmap=True,
  weights_only=True`` so that its tensors stay on disk until they are read;
- a checkpoint folder: what `save_pretrained` writes (sharded or not, safetensors or
  `.bin`) or a Hugging Face cache snapshot (see `checkpoint_folders`); each file is
  opened when the first of its tensors is read.

Names are the model's parameter and buffer names (`encoder.layer.0.weight`). A checkpoint
that wraps its state dict (`{"state_dict": {...}}`, `{"model_state_dict": {...}}`) is
unwrapped. `match_state_names` fits a checkpoint's names to the model's: tied weights by
any of their names, and a checkpoint of the base model (`h.0.attn...`) for a model with a
head (`transformer.h.0.attn...`), or the other way round, by the prefix that fits.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Union

import torch

from fx2onnx.program.checkpoint_folders import CheckpointFiles, checkpoint_files

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


def _load_torch_file(path: Path) -> Mapping[str, Any]:
    try:
        loaded = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as error:  # the checkpoint's own error, told with its path
        raise ValueError(
            f"The checkpoint '{path}' could not be loaded with torch.load(mmap=True, weights_only=True): "
            f"{error}. Give a torch.save file of a state dict, a .safetensors file, a save_pretrained "
            "folder, or the state dict itself."
        ) from error
    return _unwrap(loaded, str(path))


class _FilesSource:
    """The tensors of one or more checkpoint files, each read when it is needed.

    A `.safetensors` file is opened for each tensor read and closed right after: its
    memory map (whose pages a process's resident size counts once read) never holds more
    than the tensor being written, so saving a 7B checkpoint does not grow the process by
    the checkpoint's size. A torch.save file is loaded once (memory-mapped) when first
    needed and kept until the `with` block of `open_model_state` ends."""

    def __init__(self, files: CheckpointFiles, stack: ExitStack) -> None:
        self._files = files
        self._stack = stack
        self._loaded: dict[Path, WeightSource] = {}
        self._where: dict[str, Path] | None = dict(files.weight_map) if files.weight_map is not None else None

    def _torch_file(self, path: Path) -> WeightSource:
        if path not in self._loaded:
            self._loaded[path] = _MappingSource(_load_torch_file(path), f"the checkpoint '{path}'")
        return self._loaded[path]

    def _names_in(self, path: Path) -> list[str]:
        if path.suffix != ".safetensors":
            return self._torch_file(path).names()
        from safetensors import safe_open

        with safe_open(str(path), framework="pt", device="cpu") as handle:
            return list(handle.keys())

    def _map(self) -> dict[str, Path]:
        if self._where is None:  # no index: each file lists its names
            self._where = {name: path for path in self._files.files for name in self._names_in(path)}
        return self._where

    def names(self) -> list[str]:
        return list(self._map())

    def get(self, name: str) -> torch.Tensor:
        path = self._map()[name]
        if path.suffix != ".safetensors":
            return self._torch_file(path).get(name)
        from safetensors import safe_open

        with safe_open(str(path), framework="pt", device="cpu") as handle:
            return handle.get_tensor(name)


@contextmanager
def open_model_state(model_state: ModelState) -> Iterator[WeightSource]:
    """The tensors of ``model_state``, opened for the time of the `with` block."""
    if isinstance(model_state, Mapping):
        yield _MappingSource(model_state, "a mapping")
        return
    if not isinstance(model_state, (str, os.PathLike)):
        raise TypeError(
            "model_state must be a state dict (model.state_dict()) or the path of a checkpoint "
            f"(.safetensors, a torch.save file, or a save_pretrained folder); got {type(model_state).__name__}."
        )
    path = Path(os.fspath(model_state)).expanduser()
    if path.is_dir():
        files = checkpoint_files(path)
    elif path.is_file():
        files = CheckpointFiles((path,))
    else:
        raise FileNotFoundError(
            f"The checkpoint '{path}' given as model_state does not exist: give a .safetensors or torch.save "
            "file, a save_pretrained folder, or a Hugging Face cache snapshot folder."
        )
    with ExitStack() as stack:
        yield _FilesSource(files, stack)


@dataclass
class NameMatch:
    """How a model_state's names fit the model's (see `match_state_names`)."""

    found: dict[str, str] = field(default_factory=dict)  # model name -> name in model_state
    missing: list[str] = field(default_factory=list)  # required, not given
    unexpected: list[str] = field(default_factory=list)  # given, unknown to the model
    not_given: list[str] = field(default_factory=list)  # optional, not given: the program's values stay


def _renamings(
    wanted: Collection[str], given: Collection[str], rename: Callable[[str], str] | None
) -> Iterator[dict[str, str]]:
    """Ways to read model names from a checkpoint (model name -> checkpoint name), made
    one at a time as the search needs them: through the model's checkpoint renaming, as
    they are, then each of those with a prefix more or less."""
    bases = [{rename(name): name for name in given}] if rename is not None else []
    bases.append({name: name for name in given})
    yield from bases
    model_heads = sorted({name.split(".", 1)[0] + "." for name in wanted if "." in name})
    for base in bases:
        for prefix in model_heads:
            yield {prefix + name: checkpoint for name, checkpoint in base.items() if not name.startswith(prefix)}
        for prefix in sorted({name.split(".", 1)[0] + "." for name in base if "." in name}):
            yield {name[len(prefix):]: checkpoint for name, checkpoint in base.items() if name.startswith(prefix)}


def match_state_names(
    required: Collection[str],
    optional: Collection[str],
    given: Collection[str],
    aliases: Mapping[str, Collection[str]] | None = None,
    known: Collection[str] = (),
    rename: Callable[[str], str] | None = None,
) -> NameMatch:
    """Fit the names of a model_state to the model's.

    ``required`` names must be found (weights without data), ``optional`` ones replace the
    program's values when given; a name is found under itself or one of its ``aliases``
    (tied weights). ``rename`` is the model's own checkpoint renaming (see `capture/libraries/transformers_checkpoints.py`).
    When names are missing, a prefix added to or removed from every checkpoint name is
    tried, and the renaming that finds the most is kept. Given names
    that are neither found nor ``known`` to the model are unexpected.
    """
    aliases = aliases or {}
    required = set(required)
    wanted = [*required, *(n for n in optional if n not in required)]
    best: NameMatch | None = None
    for renaming in _renamings(wanted, given, rename):
        match = NameMatch()
        for name in wanted:
            hit = next((renaming[n] for n in (name, *aliases.get(name, ())) if n in renaming), None)
            if hit is not None:
                match.found[name] = hit
            elif name in required:
                match.missing.append(name)
            else:
                match.not_given.append(name)
        if best is None or len(match.missing) < len(best.missing) or (
            len(match.missing) == len(best.missing) and len(match.found) > len(best.found)
        ):
            best = match
        if not best.missing and len(best.found) == len(wanted):
            break
    assert best is not None
    used = set(best.found.values())
    known_names = set(known) | {a for name in known for a in aliases.get(name, ())}
    best.unexpected = sorted(name for name in given if name not in used and name not in known_names)
    return best


def listing(names: list[str], limit: int = 20) -> str:
    """The first ``limit`` names, quoted, and how many more."""
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def describe_name_mismatch(missing: list[str], unexpected: list[str], hint: str = "") -> str:
    """The message of a model_state whose names do not fit the model's."""
    parts = []
    if missing:
        parts.append(f"missing {len(missing)} tensor(s) the model needs: {listing(sorted(missing))}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected name(s) the model does not have: {listing(sorted(unexpected))}")
    return "model_state does not fit the exported model: " + "; ".join(parts) + ". Nothing was written." + hint
