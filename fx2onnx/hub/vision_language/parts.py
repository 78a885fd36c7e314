"""The parts every image-text-to-text architecture shares, cut from the checkpoint's own
modules (genai_files.py names their files and writes the configs):

- embedding (`input_ids`, `image_features` -> `inputs_embeds`): the token embedding, with
  each image token's row replaced by the next image feature, as the model's forward does;
  in Transformers.js's layout (`input_ids` -> `inputs_embeds`) the token embedding alone
  (zeros after it in rows wider than the embeddings): Transformers.js puts the image
  features into the image tokens' rows itself.
- decoder (`inputs_embeds`, `attention_mask`, `position_ids` (3-D mRoPE [3, batch, tokens]
  or 1-D [batch, tokens]), the cache -> `logits`, `present.*`): the language model and its
  head, captured as a decode step after a prefill like a causal LM (decode_step.py), with
  the same fused kernels (GroupQueryAttention where the runtime's kernel applies).

The vision models are the architectures' own (their modules: architectures.py). The wrappers hold the checkpoint's submodules under the checkpoint's own
paths (`model.language_model.*`, or Idefics3's `model.text_model.*`, and `lm_head.*`), so a
fake-mode export finds each weight in the folder by its name.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import Dim

import fx2onnx
from fx2onnx.capture import fake_copy, registered_containers
from fx2onnx.hub.decoders import decode_step
from fx2onnx.hub.loading import LoadedModel, eager_forwards
from fx2onnx.hub.vision_language.architecture import VisionLanguageArchitecture, WideRows


class Holder(torch.nn.Module):
    """A container that gives the modules it holds their checkpoint paths (the wrappers of the parts)."""

    def __init__(self, **modules: torch.nn.Module) -> None:
        super().__init__()
        for name, module in modules.items():
            self.add_module(name, module)


def language_model_name(model: torch.nn.Module) -> str:
    """The checkpoint's name of the language model in ``model.model``: `language_model`, or
    `text_model` (Idefics3's and SmolVLM's)."""
    return "language_model" if hasattr(model.model, "language_model") else "text_model"


def language_model_of(model: torch.nn.Module) -> torch.nn.Module:
    """The language model of an image-text-to-text ``model``."""
    return getattr(model.model, language_model_name(model))


class LanguageModelWithHead(torch.nn.Module):
    """An image-text-to-text model's language model and LM head under their checkpoint
    paths: the base of the decoders."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        language_model = language_model_of(model)
        self.language_model_name = language_model_name(model)
        self.model = Holder(**{self.language_model_name: language_model})
        self.lm_head = model.lm_head
        self.cache_argument = decode_step.cache_argument(language_model)

    def logits_and_cache(self, output: Any) -> dict[str, Any]:
        return {"logits": self.lm_head(output.last_hidden_state), "present": decode_step.output_cache(output)}


@contextlib.contextmanager
def attention_implementation(config: Any, name: str, function: Callable[..., Any], masks_like: str | None = None) -> Iterator[None]:
    """transformers' attention of the models of ``config`` computed by ``function``
    (registered as ``name``) while the context lasts; ``masks_like``: fed the masks
    transformers makes for that implementation (without it, none for a mask made from
    padding)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(name, function)
    if masks_like is not None:
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[masks_like])
    kept = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = kept


class Embedding(torch.nn.Module):
    """Token embeddings with the image tokens' rows taken from ``image_features`` in order;
    rows ``width`` wide (zeros after the embedding at text tokens: wide rows' features)."""

    def __init__(self, model: torch.nn.Module, image_token_id: int, width: int) -> None:
        super().__init__()
        self.name = language_model_name(model)
        self.model = Holder(**{self.name: Holder(embed_tokens=language_model_of(model).embed_tokens)})
        self.image_token_id = image_token_id
        self.extra = width - int(model.config.text_config.hidden_size)

    def forward(self, input_ids: torch.Tensor, image_features: torch.Tensor) -> dict[str, torch.Tensor]:
        embeds = getattr(self.model, self.name).embed_tokens(input_ids)
        if self.extra:
            embeds = torch.cat([embeds, embeds.new_zeros(*embeds.shape[:-1], self.extra)], dim=-1)
        if image_features.dim() == 3:  # [images, tokens per image, hidden] (Gemma 3's): the images' rows in order
            image_features = image_features.reshape(-1, image_features.shape[-1])
        return {"inputs_embeds": with_feature_rows(embeds, input_ids == self.image_token_id, image_features)}


def with_feature_rows(embeds: torch.Tensor, is_feature: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """``embeds`` whose rows at ``is_feature`` tokens are ``features``' rows in order: the
    k-th such token (counted across the batch) takes row k. A decode step has no features
    and keeps the token's own embedding, as transformers does for an image token it
    generates; an appended zero row keeps the gather in bounds."""
    count = features.shape[0]
    rows = torch.cat([features.to(embeds.dtype), embeds.new_zeros(1, embeds.shape[-1])])
    flat = is_feature.reshape(-1)
    index = (torch.cumsum(flat.to(torch.int64), dim=0) - 1).reshape(is_feature.shape)
    takes = is_feature & (index < count)
    index = torch.where(takes, index, count)
    return torch.where(takes[..., None], rows[index], embeds)


class TokenEmbedding(torch.nn.Module):
    """The token embedding alone (Transformers.js's `embed_tokens`), its rows ``width`` wide
    (zeros after the embedding: the wide rows' columns of a text token; Transformers.js
    replaces an image token's whole row by its features row)."""

    def __init__(self, model: torch.nn.Module, width: int | None = None) -> None:
        super().__init__()
        self.name = language_model_name(model)
        self.model = Holder(**{self.name: Holder(embed_tokens=language_model_of(model).embed_tokens)})
        self.extra = 0 if width is None else width - int(model.config.text_config.hidden_size)

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        embeds = getattr(self.model, self.name).embed_tokens(input_ids)
        if self.extra:
            embeds = torch.cat([embeds, embeds.new_zeros(*embeds.shape[:-1], self.extra)], dim=-1)
        return {"inputs_embeds": embeds}


def export_token_embedding(loaded: LoadedModel, options: fx2onnx.ExportOptions, width: int | None = None) -> fx2onnx.ONNXProgram:
    """The program of Transformers.js's `embed_tokens` (`input_ids` -> `inputs_embeds`, rows
    ``width`` wide: the embedding's, else wider with zeros after it)."""
    vocab = int(loaded.config.text_config.vocab_size)
    ids = as_loaded(torch.randint(0, vocab, (2, 9), generator=torch.Generator().manual_seed(0)), loaded)
    return fx2onnx.dynamo_export(TokenEmbedding(loaded.model, width), input_ids=ids, export_options=without_causal_mask(options))


class Decoder(LanguageModelWithHead):
    """The language model and its head over ``inputs_embeds`` and the cache (rows wider
    than the embeddings read by ``wide_rows``)."""

    def __init__(self, model: torch.nn.Module, wide_rows: WideRows | None = None) -> None:
        super().__init__(model)
        self.wide_rows = wide_rows
        self.hidden = int(model.config.text_config.hidden_size)

    def forward(self, inputs_embeds, attention_mask, position_ids, past_key_values) -> dict[str, Any]:
        language_model, extra = getattr(self.model, self.language_model_name), {}
        if self.wide_rows is not None:
            inputs_embeds, extra = self.wide_rows.split(language_model, inputs_embeds, self.hidden)
        try:
            output = language_model(
                inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
                **{self.cache_argument: past_key_values}, **extra,
            )
        finally:
            if self.wide_rows is not None:
                self.wide_rows.restore(language_model)
        return self.logits_and_cache(output)


def as_loaded(value: Any, loaded: LoadedModel, static: bool = False) -> Any:
    """``value``'s tensors made fake when the model is (a fake-mode export), else as they
    are; ``static``: with their sizes as numbers (Gemma 3's vision model's one image size)."""
    if loaded.fake_context is None:
        return value
    mode = loaded.fake_context.fake_mode
    return pytree.tree_map_only(torch.Tensor, lambda tensor: fake_copy(mode, tensor, static), value)


def embedding_inputs(loaded: LoadedModel, width: int, per_image: bool = False) -> dict[str, torch.Tensor]:
    """Two sequences with 5 image tokens, features rows ``width`` wide; ``per_image``: the
    features as the vision model gives them per image ([images, tokens, hidden], here one
    image of 5 tokens)."""
    config = loaded.config
    vocab = int(config.text_config.vocab_size)
    ids = torch.randint(0, vocab, (2, 9), generator=torch.Generator().manual_seed(0))
    ids[ids == config.image_token_id] = 0
    ids[0, 2:5] = config.image_token_id  # 3 image tokens in one sequence, 2 in the other
    ids[1, 4:6] = config.image_token_id
    features = torch.randn(5, width, generator=torch.Generator().manual_seed(1))
    if per_image:
        features = features[None]
    return as_loaded({"input_ids": ids, "image_features": features}, loaded)


def decoder_inputs(loaded: LoadedModel, architecture: VisionLanguageArchitecture) -> dict[str, Any]:
    """A decode step after a prefill (sizes as causal_lm's), with text positions on all 3
    mRoPE axes (1-D positions, [batch, tokens], for an architecture without mRoPE)."""
    hidden = int(loaded.config.text_config.hidden_size)
    return decode_step_over_embeds(loaded, language_model_of(loaded.model), hidden, architecture.mrope,
                                   architecture.row_width(loaded.config) - hidden)


def decode_step_over_embeds(
    loaded: LoadedModel, language_model: torch.nn.Module, hidden: int, mrope: bool, width: int = 0, cache: Any = None,
) -> dict[str, Any]:
    """``language_model``'s decode step after a prefill over `inputs_embeds` ``hidden``
    wide, positions 3-D with ``mrope``, and ``width`` extra columns (wide rows); the prefill
    fills ``cache`` where given (a cache whose sliding layers grow: sliding_window.py)."""
    batch, cached, new = decode_step.BATCH, decode_step.CACHED_TOKENS, decode_step.NEW_TOKENS
    embeds = torch.randn(batch, cached + new, hidden, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(batch, cached + new, dtype=torch.int64)
    positions = torch.arange(cached + new).view(1, 1, -1).expand(3, batch, -1).contiguous()
    if not mrope:
        positions = positions[0]
    embeds, mask, positions = as_loaded((embeds, mask, positions), loaded)
    mode = eager_forwards(loaded)
    with mode, torch.no_grad():
        given = {decode_step.cache_argument(language_model): cache} if cache is not None else {}
        prefill = language_model(
            inputs_embeds=embeds[:, :cached], attention_mask=mask[:, :cached], position_ids=positions[..., :cached], use_cache=True,
            **given,
        )
    cache = decode_step.output_cache(prefill)
    step = embeds[:, cached:]
    if width:  # the wide rows' columns (Qwen3-VL's DeepStack)
        extra = torch.randn(batch, new, width, generator=torch.Generator().manual_seed(2))
        step = torch.cat([step, as_loaded(extra, loaded)], dim=-1)
    return {"inputs_embeds": step, "attention_mask": mask, "position_ids": positions[..., cached:].contiguous(),
            "past_key_values": cache}


def _dynamic(value: Any, keep: dict[int, int] | None = None) -> Any:
    """Every dim of ``value``'s tensors dynamic but those of ``keep`` (torch.export's spec form)."""
    if isinstance(value, torch.Tensor):
        return {index: Dim.AUTO for index in range(value.dim()) if index not in (keep or {})}
    if isinstance(value, dict):  # a spec mirrors a dict by its keys (a linear-attention layer's states)
        return {key: _dynamic(child) for key, child in value.items()}
    node = pytree.SUPPORTED_NODES.get(type(value))
    if node is None and not isinstance(value, (list, tuple)):
        return None
    children = node.flatten_fn(value)[0] if node is not None else value
    return [_dynamic(child) for child in children]


def decoder_dynamic_shapes(inputs: dict[str, Any]) -> dict[str, Any]:
    """Dynamic batch, lengths and cache; the 3 mRoPE axes of a 3-D `position_ids` stay 3. The
    cache's spec follows the flattening the capture registers for it."""
    with registered_containers():
        return {
            name: _dynamic(value, {0: 3} if name == "position_ids" and value.dim() == 3 else None)
            for name, value in inputs.items()
        }


def without_causal_mask(options: fx2onnx.ExportOptions) -> fx2onnx.ExportOptions:
    """The options of a part whose attention is not the decoder's causal one."""
    return dataclasses.replace(options, causal_mask_input=None)


def export_text_parts(
    loaded: LoadedModel, options: fx2onnx.ExportOptions, architecture: VisionLanguageArchitecture,
    programs: dict[str, fx2onnx.ONNXProgram],
) -> dict[str, fx2onnx.ONNXProgram]:
    """``programs`` with the embedding (the token embedding alone where the architecture's
    client merges the images) and the decoder over `inputs_embeds` added."""
    config, model = loaded.config, loaded.model
    width = architecture.row_width(config)
    if architecture.merges_images:
        programs["embedding"] = fx2onnx.dynamo_export(
            Embedding(model, int(config.image_token_id), width), **embedding_inputs(loaded, width),
            export_options=without_causal_mask(options),
        )
    else:
        programs["embedding"] = export_token_embedding(loaded, options, width)
    programs["decoder"] = export_decoder(loaded, options, decoder_inputs(loaded, architecture), architecture.wide_rows)
    return programs


def export_decoder(
    loaded: LoadedModel, options: fx2onnx.ExportOptions, inputs: dict[str, Any], wide_rows: WideRows | None = None,
) -> fx2onnx.ONNXProgram:
    """The program of the decoder over `inputs_embeds` (``inputs``: a decode step's), its
    batch, lengths and cache dynamic, the causal mask from `attention_mask` where the text
    model attends causally."""
    causal = decode_step.attends_causally(loaded.config.text_config)
    decoder_options = dataclasses.replace(
        options, dynamic_shapes=decoder_dynamic_shapes(inputs), causal_mask_input="attention_mask" if causal else None
    )
    return fx2onnx.dynamo_export(Decoder(loaded.model, wide_rows), **inputs, export_options=decoder_options)
