"""The weights of a safetensors checkpoint folder under the names of a part of a
transformers model (a module holding some of the model's modules: vision_language/parts.py's
wrappers, seq2seq's halves, a multimodal model's language model), read one tensor at a
time: what a fake-mode export of such a part gives `ONNXProgram.save(model_state=...)`
(`part_checkpoint`, the one way export-hf names a part's weights). transformers writes some checkpoints under legacy
names (Qwen2.5-VL: `model.layers.*`, `visual.*` for the model's
`model.language_model.layers.*`, `model.visual.*`); the renaming is transformers' own
table for the model's class (`capture.libraries.transformers_checkpoints`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from fx2onnx.capture import checkpoint_renaming
from fx2onnx.program import checkpoint_files


class RenamedCheckpoint(Mapping[str, torch.Tensor]):
    """The tensors of the checkpoint in ``folder`` by the names ``model``'s modules give them."""

    def __init__(self, folder: Path, model: torch.nn.Module) -> None:
        from safetensors import safe_open

        rename = checkpoint_renaming(model) or (lambda name: name)
        self._where: dict[str, tuple[Path, str]] = {}
        for path in checkpoint_files(folder).files:
            if path.suffix != ".safetensors":
                raise NotImplementedError(
                    f"'{path.name}' is a torch.save checkpoint: a fake-mode export of this model reads .safetensors "
                    "files; save the model with safe_serialization (the default) or export without fake mode."
                )
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                for key in handle.keys():
                    self._where[rename(key)] = (path, key)

    def only(self, names: set[str]) -> RenamedCheckpoint:
        """The same checkpoint restricted to ``names`` (one part's weights: the others are not unused weights of it)."""
        part = RenamedCheckpoint.__new__(RenamedCheckpoint)
        part._where = {name: where for name, where in self._where.items() if name in names}
        return part

    def renamed(self, sources: Mapping[str, list[str]]) -> RenamedCheckpoint:
        """The same checkpoint under other names: each name of ``sources`` reads the first of
        its names here that the checkpoint holds (a text-only export's causal LM, whose
        tensors are the multimodal model's)."""
        other = RenamedCheckpoint.__new__(RenamedCheckpoint)
        other._where = {
            name: self._where[held[0]] for name, names in sources.items() if (held := [n for n in names if n in self._where])
        }
        return other

    def __getitem__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        path, key = self._where[name]
        with safe_open(str(path), framework="pt", device="cpu") as handle:  # opened per tensor: no map kept
            return handle.get_tensor(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def source_names(part: torch.nn.Module, model: torch.nn.Module) -> dict[str, list[str]]:
    """``part``'s parameter and buffer names -> every name ``model`` gives the same tensor
    (tied weights have several; a checkpoint holds one of them)."""
    def named(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
        return [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]

    own: dict[int, list[str]] = {}
    for name, tensor in named(model):
        own.setdefault(id(tensor), []).append(name)
    return {name: own[id(tensor)] for name, tensor in named(part) if id(tensor) in own}


def part_checkpoint(folder: Path, model: torch.nn.Module, part: torch.nn.Module) -> RenamedCheckpoint:
    """The tensors of ``model``'s checkpoint in ``folder`` by the names ``part`` gives them
    (``part`` may be ``model`` itself: every name of a tied weight then reads the one the
    checkpoint holds)."""
    return RenamedCheckpoint(folder, model).renamed(source_names(part, model))
