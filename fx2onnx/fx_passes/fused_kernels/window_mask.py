"""The sliding window of an attention mask built from the causal-mask input, counted in held tokens.

A sliding layer's mask (export-hf's, `hub/decoders/sliding_window.py`) is the causal mask over the
tokens the input holds, narrowed to the keys among the last ``W`` held tokens of each
query: ``cumsum(mask)[query] - cumsum(mask)[key] < W``. onnxruntime's
``GroupQueryAttention`` has that window as ``local_window_size``, counted in cache slots,
which is the same count when no row has padding after a held token (no padding, or
padding on the left); ``onnx_passes/cached_attention_guard`` runs the exact form
otherwise.
"""

from __future__ import annotations

from typing import Any

import torch

from fx2onnx.fx_passes.fused_kernels.matching import Refusal

_aten = torch.ops.aten
_SAME_COUNTS = {_aten.unsqueeze.default, _aten.slice.Tensor, _aten._to_copy.default, _aten.alias.default}
_MASK_DEPTH = 24  # a mask's expression is a few nodes deep: its search stops there


def _counts_of(node: Any, tokens: torch.fx.Node, axis: int) -> bool:
    """Whether ``node`` is the running count of ``tokens``'s held tokens (a `cumsum` along
    its last dim), sliced and unsqueezed at ``axis`` (2: one row per query, 1: one column
    per key)."""
    unsqueezed = False
    while isinstance(node, torch.fx.Node) and node.target in _SAME_COUNTS:
        if node.target == _aten.unsqueeze.default:
            if unsqueezed or node.args[1] != axis:
                return False
            unsqueezed = True
        node = node.args[0]
    if not (unsqueezed and isinstance(node, torch.fx.Node) and node.target == _aten.cumsum.default):
        return False
    source = node.args[0]
    while isinstance(source, torch.fx.Node) and source.target == _aten._to_copy.default:
        source = source.args[0]
    return source is tokens and node.args[1] in (-1, 1)


def _window_of(node: torch.fx.Node, tokens: torch.fx.Node) -> int | None:
    """``W`` when ``node`` is ``counts[query] - counts[key] < W``."""
    if node.target != _aten.lt.Scalar or not isinstance(node.args[1], int):
        return None
    difference = node.args[0]
    if not isinstance(difference, torch.fx.Node) or difference.target != _aten.sub.Tensor:
        return None
    query, key = difference.args[:2]
    return node.args[1] if _counts_of(query, tokens, 2) and _counts_of(key, tokens, 1) else None


def _ancestors(mask: torch.fx.Node, tokens: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes ``mask`` is computed from, up to the model's inputs."""
    found, frontier = [], [(mask, 0)]
    seen = {mask}
    while frontier:
        node, depth = frontier.pop()
        found.append(node)
        if node is tokens or node.op == "placeholder" or depth >= _MASK_DEPTH:
            continue
        for source in node.all_input_nodes:
            if source not in seen:
                seen.add(source)
                frontier.append((source, depth + 1))
    return found


def held_token_window(mask: torch.fx.Node | None, tokens: torch.fx.Node) -> int | Refusal | None:
    """The window ``W`` of a mask built from ``tokens`` (the causal-mask input) as a
    sliding layer's; None for a mask without a window; a :class:`Refusal` when the mask
    counts the held tokens in another way (the kernel would not compute it)."""
    if mask is None:
        return None
    nodes = _ancestors(mask, tokens)
    windows = {_window_of(node, tokens) for node in nodes} - {None}
    counted = any(node.target == _aten.cumsum.default for node in nodes)
    if len(windows) == 1:
        (window,) = windows
        return window if window > 0 else Refusal(f"a sliding window of {window} tokens")
    if windows or counted:
        return Refusal("a mask that counts the held tokens otherwise than one sliding window")
    return None
