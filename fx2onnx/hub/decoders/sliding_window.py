"""Sliding-window attention in a causal LM's folder, exact at every length.

transformers keeps a sliding layer's cache at its window (`DynamicSlidingWindowLayer`),
which a capture fixes at one fill: the graph is then wrong before the window is full
and fails once the sequence passes it. A folder's decoder is instead captured with a
cache that grows in every layer (`growing_cache`), and each layer's window is a part of
its mask (`masks_by_held_tokens`), built from `attention_mask`:

- a sliding layer's query sees the keys among the last `sliding_window` tokens the mask
  holds (its own included), counted in held tokens rather than cache slots, so that a
  right-padded batch (ONNX Runtime GenAI pads on the right: the padding then sits between
  a row's prompt and its new tokens) sees what the row alone sees; in a left-padded
  batch (transformers, Transformers.js) the two counts are the same;
- a full layer's query sees every held key up to itself;
- a query sees at least itself, so that a padding token's attention (whose result no held
  token reads) stays finite instead of carrying NaN into the next layer's cache.

The cache then holds every token of the sequence: memory grows with the sequence as a
full layer's does, the numbers are transformers'. These masks are of the form
`ExportOptions.causal_mask_input` promises (`causal_within_windows`): where the attention
is scaled-dot-product attention, each layer becomes onnxruntime's `GroupQueryAttention`,
a sliding one with its window as `local_window_size` (exact form where a row has padding
after a held token).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from fx2onnx.hub.tasks import UnsupportedArchitectureError

SLIDING, FULL = "sliding_attention", "full_attention"
# the layer kinds that read a 2-D mask of their own tokens (a hybrid's convolution and linear attention)
RECURRENT = ("conv", "linear_attention")


def layers_config(config: Any) -> Any:
    """The config of the decoder's layers: the model's own, or the one the model nests its
    decoder's in (a multimodal model's `text_config`, Gemma 4's, which alone gives its windows;
    `EncoderDecoderModel`'s `decoder`)."""
    get_text_config = getattr(config, "get_text_config", None)
    return get_text_config(decoder=True) if get_text_config is not None else config


def window_of(config: Any) -> int | None:
    """The sliding window of ``config``'s sliding layers, None when no layer has one."""
    config = layers_config(config)
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return int(window) if SLIDING in layer_types else None
    return int(window) if getattr(config, "use_sliding_window", True) else None


def causal_within_windows(config: Any) -> bool:
    """Whether every mask a model of ``config`` reads under :func:`masks_by_held_tokens`
    is causal over the held tokens, a sliding layer's within its window of held tokens
    (the form `ExportOptions.causal_mask_input` promises): a window, and no chunked
    attention, ALiBi or other kind of layer."""
    config = layers_config(config)
    layer_types = getattr(config, "layer_types", None)
    return (
        window_of(config) is not None and (layer_types is None or set(layer_types) <= {SLIDING, FULL})
        and getattr(config, "attention_chunk_size", None) is None and not getattr(config, "alibi", False)
    )


def growing_cache(config: Any) -> Any:
    """An empty cache whose every layer grows with the sequence (None when no layer of
    ``config`` slides: the model's own cache is then the same)."""
    if window_of(config) is None:
        return None
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    cache = DynamicCache(config=layers_config(config))  # a hybrid's convolution layers keep their own kind
    cache.layers = [DynamicLayer() if isinstance(layer, DynamicSlidingWindowLayer) else layer for layer in cache.layers]
    return cache


def _visible(attention_mask: torch.Tensor, queries: int, window: int | None) -> torch.Tensor:
    """(B, 1, S, T) booleans: which of the T keys each of the last S queries sees."""
    total = attention_mask.shape[1]
    held = attention_mask.bool()
    slots = torch.arange(total, device=attention_mask.device)
    query_slots = slots[total - queries:]
    itself = slots[None, :] == query_slots[:, None]
    visible = (slots[None, :] <= query_slots[:, None])[None] & held[:, None, :]
    if window is not None:
        counts = attention_mask.to(torch.int64).cumsum(-1)
        visible = visible & (counts[:, total - queries:, None] - counts[:, None, :] < window)
    return (visible | itself[None])[:, None]


def _in_format(visible: torch.Tensor, implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """``visible`` as the attention implementation reads a mask: booleans for SDPA, a
    bias (0 or the dtype's lowest) added to the scores for eager attention."""
    if implementation == "sdpa":
        return visible
    if implementation == "eager":
        return (~visible).to(dtype) * torch.finfo(dtype).min
    raise NotImplementedError(
        f"The model's attention implementation is {implementation!r}; a sliding-window model's folder is exported "
        "with 'sdpa' or 'eager' attention: load it with attn_implementation='sdpa'."
    )


def masks_for(config: Any, attention_mask: torch.Tensor, queries: int, dtype: torch.dtype) -> Any:
    """The masks a model of ``config`` reads for its last ``queries`` tokens: a dict by
    layer type where the config has `layer_types`, else the one mask of its (sliding) layers.
    A hybrid's convolution or linear-attention layer reads which of its tokens are held
    (transformers' `create_recurrent_attention_mask`), which zeroes the padding it reads."""
    config = layers_config(config)
    implementation = config._attn_implementation or "eager"
    window = window_of(config)
    sliding = _in_format(_visible(attention_mask, queries, window), implementation, dtype)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        return sliding
    masks = {SLIDING: sliding, FULL: _in_format(_visible(attention_mask, queries, None), implementation, dtype)}
    unknown = sorted(set(layer_types) - set(masks) - set(RECURRENT))
    if unknown:
        raise UnsupportedArchitectureError(
            f"{config.model_type} has layers of kind {', '.join(unknown)} beside its sliding-window ones, whose masks "
            "export-hf does not build; export the decode step with fx2onnx.dynamo_export instead. Nothing was written."
        )
    return masks | dict.fromkeys(set(layer_types) & set(RECURRENT), attention_mask[:, attention_mask.shape[1] - queries:])


def _decoder(model: torch.nn.Module) -> torch.nn.Module:
    """The module a causal LM hands `attention_mask` to (its base model)."""
    return getattr(model, "base_model", model)


@contextlib.contextmanager
def masks_by_held_tokens(model: torch.nn.Module) -> Iterator[None]:
    """Within this context, ``model``'s decoder reads the masks of :func:`masks_for`,
    built from the 2-D `attention_mask` it is given, instead of transformers' own (which
    count a window in cache slots). Nothing changes for a model without a sliding window."""
    config = model.config
    if window_of(config) is None:
        yield
        return
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())

    def with_masks(_module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        mask = kwargs.get("attention_mask")
        if mask is None or mask.dim() != 2:
            return args, kwargs
        new = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs.get("inputs_embeds")
        return args, {**kwargs, "attention_mask": masks_for(config, mask, new.shape[1], dtype)}

    handle = _decoder(model).register_forward_pre_hook(with_masks, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
