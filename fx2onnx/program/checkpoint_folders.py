"""Which files of a checkpoint folder hold a model's weights, and which tensor is where.

Folders as users have them:
- a `save_pretrained` folder: `model.safetensors`, or shards with their index
  `model.safetensors.index.json`; or the older `pytorch_model.bin`, sharded with
  `pytorch_model.bin.index.json`;
- a Hugging Face cache snapshot (`.../models--org--name/snapshots/<revision>/`, whose
  files are links into `blobs/`), or the model's cache folder itself
  (`.../models--org--name`), resolved through `refs/main`;
- any folder with `.safetensors` files and nothing else to choose from.

Safetensors files are preferred to `.bin` files when a folder has both, as transformers
does. Nothing is read here but the index files' JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_SINGLE = "model.safetensors"
BIN_INDEX = "pytorch_model.bin.index.json"
BIN_SINGLE = "pytorch_model.bin"


@dataclass(frozen=True)
class CheckpointFiles:
    """The files of a checkpoint: each file, and for sharded checkpoints the file of each
    tensor name (None: every file lists its own names)."""

    files: tuple[Path, ...]
    weight_map: dict[str, Path] | None = None


def snapshot_folder(folder: Path) -> Path:
    """The snapshot to read in a Hugging Face cache folder (`models--org--name`), or the
    folder itself when it is not one."""
    snapshots = folder / "snapshots"
    if not snapshots.is_dir():
        return folder
    main = folder / "refs" / "main"
    if main.is_file():
        revision = main.read_text().strip()
        if (snapshots / revision).is_dir():
            return snapshots / revision
    found = sorted(p for p in snapshots.iterdir() if p.is_dir())
    if len(found) == 1:
        return found[0]
    raise ValueError(
        f"The Hugging Face cache folder '{folder}' holds {len(found)} snapshots "
        f"({', '.join(p.name for p in found) or 'none'}) and no refs/main naming one: give the "
        "path of the snapshot to use (.../snapshots/<revision>)."
    )


def _sharded(folder: Path, index_name: str) -> CheckpointFiles:
    index_path = folder / index_name
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"The checkpoint index '{index_path}' could not be read ({type(error).__name__}: {error}); "
            "it must be JSON with a 'weight_map' from tensor names to shard files, as save_pretrained writes."
        ) from error
    paths = {name: folder / file for name, file in weight_map.items()}
    absent = sorted({str(p.name) for p in paths.values() if not p.is_file()})
    if absent:
        raise FileNotFoundError(
            f"The checkpoint index '{index_path}' names {len(absent)} shard file(s) that are not in the "
            f"folder: {', '.join(absent[:5])}{' ...' if len(absent) > 5 else ''}. Download or copy the whole "
            "checkpoint (an interrupted download leaves shards missing)."
        )
    return CheckpointFiles(tuple(dict.fromkeys(paths.values())), paths)


def checkpoint_files(folder: Path) -> CheckpointFiles:
    """The weight files of a checkpoint folder (see the module docstring)."""
    folder = snapshot_folder(folder)
    if (folder / SAFETENSORS_INDEX).is_file():
        return _sharded(folder, SAFETENSORS_INDEX)
    if (folder / SAFETENSORS_SINGLE).is_file():
        return CheckpointFiles((folder / SAFETENSORS_SINGLE,))
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if len(indexes) == 1:
        return _sharded(folder, indexes[0].name)
    if (folder / BIN_INDEX).is_file():
        return _sharded(folder, BIN_INDEX)
    if (folder / BIN_SINGLE).is_file():
        return CheckpointFiles((folder / BIN_SINGLE,))
    safetensors_files = sorted(p for p in folder.glob("*.safetensors") if p.is_file())
    if safetensors_files and not indexes:
        return CheckpointFiles(tuple(safetensors_files))
    what = f"{len(indexes)} index files to choose from ({', '.join(p.name for p in indexes)})" if indexes else "no weights"
    raise FileNotFoundError(
        f"The folder '{folder}' given as model_state has {what}: expected {SAFETENSORS_SINGLE}, "
        f"{SAFETENSORS_INDEX} with its shards, {BIN_SINGLE} or {BIN_INDEX} (what save_pretrained "
        "writes), or .safetensors files. Give the path of one file, or of the folder that save_pretrained wrote."
    )


__all__ = ["CheckpointFiles", "checkpoint_files", "snapshot_folder"]
