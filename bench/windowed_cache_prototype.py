"""A measuring copy of an `export-hf` sliding-window folder whose sliding layers hold a
window-sized cache in ONNX Runtime GenAI, to show what that cache would save: NOT a folder
to ship.

The copy sets onnxruntime's `sliding_window_cache` on every `GroupQueryAttention` with a
`local_window_size` (each branch of the layers' guards) and adds the `sliding_window`
section of `genai_config.json` (the sliding layers, the runtime's default slack), so
that the runtime gives those layers a buffer of the window plus its slack and the kernel
keeps the most recent positions in it. Its weights are the folder's own (a hard link to
its data file).

It is exact only where the kernel's slots are the model's held tokens and the kernel
branch runs: one prompt at a time (the benchmark's case; its greedy tokens are compared
with the folder's). The folder counts slots as `attention_mask` columns, so a right-padded
batch would keep the padding in the window's slots, and its exact branches write a
whole-context cache, not the kernel's windowed layout.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import onnx

_KERNEL = ("com.microsoft", "GroupQueryAttention")


def _graphs(graph: onnx.GraphProto):
    """``graph`` and every subgraph under it (the guards' branches)."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            for sub in (*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs):
                yield from _graphs(sub)


def windowed_kernels(model: onnx.ModelProto) -> int:
    """Mark every sliding kernel of ``model`` as reading a window-sized cache; returns the
    window (their `local_window_size`)."""
    windows = set()
    for graph in _graphs(model.graph):
        for node in graph.node:
            if (node.domain, node.op_type) != _KERNEL:
                continue
            window = next((a.i for a in node.attribute if a.name == "local_window_size"), -1)
            if window > 0:
                windows.add(window)
                node.attribute.append(onnx.helper.make_attribute("sliding_window_cache", 1))
    if len(windows) != 1:
        raise ValueError(f"expected one sliding window among the kernels, found {sorted(windows)}")
    return windows.pop()


def write_windowed_copy(folder: Path, out: Path) -> Path:
    """``folder``'s copy at ``out`` with a window-sized cache for its sliding layers."""
    shutil.copytree(folder, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.onnx", "*.onnx_data"))
    config = json.loads((folder / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    model = onnx.load(os.fspath(folder / decoder["filename"]), load_external_data=False)
    window = windowed_kernels(model)
    target = out / decoder["filename"]
    target.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, os.fspath(target))
    for data in (folder / decoder["filename"]).parent.glob("*.onnx_data"):
        link = target.parent / data.name
        if not link.exists():  # a hard link: onnxruntime refuses data that resolves outside the model's folder
            os.link(data, link)
    layer_types = json.loads((folder / "config.json").read_text()).get("layer_types")
    layers = list(range(decoder["num_hidden_layers"])) if layer_types is None else [
        i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]
    decoder["sliding_window"] = {"window_size": window, "slide_key_value_cache": False, "slide_inputs": False,
                                 "layers": layers, "cache_slack": 0}  # 0: the runtime's default slack
    (out / "genai_config.json").write_text(json.dumps(config, indent=4))
    return out
