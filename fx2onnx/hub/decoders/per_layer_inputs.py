"""A text-generation folder's two extra models for Transformers.js's embedded-decoder layout (Gemma 4, Gemma 3n).

Transformers.js runs a ``gemma4`` causal LM, and Gemma 3n's language model (a ``gemma3n_text``
folder, whose `config.json` names Gemma 3n's multimodal class for it:
client_support.TRANSFORMERS_JS_WRAPPED_TYPES), through its image-audio-text-to-text
class (Gemma 3n's forward): it never loads `onnx/model.onnx`, but

- `onnx/embed_tokens.onnx`: `input_ids` -> `inputs_embeds` and, for a model with per-layer
  inputs, `per_layer_inputs` ([batch, tokens, layers, size]), run on every step's ids;
- `onnx/decoder_model_merged.onnx`: `inputs_embeds`, `per_layer_inputs`, `attention_mask`,
  `position_ids` (from the mask, as transformers counts them) and the cache ->
  `logits` and `present.*`, fed back as the next step's cache.

The folder keeps its `onnx/model.onnx` (ONNX Runtime GenAI's and Optimum-style loaders')
and gets these two beside it, each with its own data file:

- the embedding is the text model's scaled token embedding and the token part of its
  per-layer inputs (``get_per_layer_inputs``: ids past the per-layer table's rows read
  its row 0, Gemma 3n's table holding the text vocabulary alone), of the ids with image,
  video and audio tokens replaced by padding, as the multimodal model's forward does;
- the decoder is the text model from those (it adds the projection of the embeddings to
  the per-layer inputs itself), its head and the logits' soft cap, captured as a decode
  step after a prefill with the options and masks of the folder's own model.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

import fx2onnx
from fx2onnx.capture import fake_copy
from fx2onnx.hub.decoders import decode_step
from fx2onnx.hub.decoders.sliding_window import masks_by_held_tokens
from fx2onnx.hub.loading import LoadedModel, eager_forwards
from fx2onnx.hub.shared import folder_layout
from fx2onnx.hub.shared.dim_roles import BATCH, SEQUENCE
from fx2onnx.hub.shared.program_files import exported, onnx_file, save_program
from fx2onnx.hub.vision_language.parts import Holder

# model types whose Transformers.js causal-LM class loads embed_tokens and decoder_model_merged
# (Gemma 3n's text model's through the class of the type its config.json is given: gemma3n)
EMBEDDED_DECODER_TYPES = frozenset({"gemma4", "gemma3n_text"})
EMBEDDING, PER_LAYER = "embed_tokens", "per_layer_inputs"
# the multimodal config's token ids its forward embeds as padding
_PLACEHOLDER_IDS = ("image_token_id", "video_token_id", "audio_token_id")


def writes_embedded_decoder(config: Any) -> bool:
    """Whether a text-generation folder of ``config`` gets Transformers.js's embedding and
    decoder beside its model."""
    return getattr(config, "model_type", None) in EMBEDDED_DECODER_TYPES


def _text_model(model: torch.nn.Module) -> torch.nn.Module:
    """The text model of a multimodal model (`model.language_model`) or of a causal LM (`model`)."""
    return getattr(model.model, "language_model", model.model)


def _at_text_model_path(model: torch.nn.Module, module: torch.nn.Module) -> torch.nn.Module:
    """``module`` held where the checkpoint has ``model``'s text model (`model.language_model`
    or `model`, as the wrapper's `model`), so that a fake-mode export finds each weight by its name."""
    return Holder(language_model=module) if hasattr(model.model, "language_model") else module


def _held_text_model(held: torch.nn.Module) -> torch.nn.Module:
    return getattr(held, "language_model", held)


class PerLayerEmbedding(torch.nn.Module):
    """`input_ids` -> `inputs_embeds` and the token part of the per-layer inputs."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        text = _text_model(model)
        self.layers, self.size = int(text.config.num_hidden_layers), int(text.config.hidden_size_per_layer_input or 0)
        # the per-layer table's rows where it holds fewer than the vocabulary (Gemma 3n's), else None
        rows = getattr(text.config, "vocab_size_per_layer_input", None)
        self.table_rows = int(rows) if isinstance(rows, int) and 0 < rows < int(text.config.vocab_size) else None
        parts = {"embed_tokens": text.embed_tokens}
        if self.size:
            parts["embed_tokens_per_layer"] = text.embed_tokens_per_layer
        self.model = _at_text_model_path(model, Holder(**parts))
        # a causal LM's forward embeds every id; a multimodal model's, its image, video and audio tokens as padding
        multimodal = hasattr(model.model, "language_model")
        self.placeholders = [int(i) for i in (getattr(model.config, n, None) for n in _PLACEHOLDER_IDS) if i is not None
                             and multimodal]
        self.pad = int(text.config.pad_token_id or 0)

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        ids = input_ids
        for token in self.placeholders:
            ids = torch.where(ids == token, self.pad, ids)
        parts = _held_text_model(self.model)
        found = {"inputs_embeds": parts.embed_tokens(ids)}
        if self.size:
            in_table = ids if self.table_rows is None else torch.where((ids >= 0) & (ids < self.table_rows), ids, 0)
            found[PER_LAYER] = parts.embed_tokens_per_layer(in_table).reshape(*ids.shape, self.layers, self.size)
        return found


class PerLayerDecoder(torch.nn.Module):
    """The text model over `inputs_embeds` (and `per_layer_inputs`, where it has them), its
    head and the logits' soft cap."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = _at_text_model_path(model, _text_model(model))
        self.lm_head = model.lm_head
        text = self.text_model()
        self.cap = getattr(text.config, "final_logit_softcapping", None)
        self.cache_argument = decode_step.cache_argument(text)

    def text_model(self) -> torch.nn.Module:
        return _held_text_model(self.model)

    def forward(self, inputs_embeds, attention_mask, position_ids, past_key_values, per_layer_inputs=None) -> dict[str, Any]:
        output = self.text_model()(
            inputs_embeds=inputs_embeds, per_layer_inputs=per_layer_inputs, attention_mask=attention_mask,
            position_ids=position_ids, use_cache=True, **{self.cache_argument: past_key_values},
        )
        logits = self.lm_head(output.last_hidden_state)
        if self.cap is not None:
            logits = torch.tanh(logits / self.cap) * self.cap
        return {"logits": logits, "present": decode_step.output_cache(output)}


def _decoder_inputs(loaded: LoadedModel, embedding: torch.nn.Module) -> dict[str, Any]:
    """The folder's decode step (decode_step.py) with its ids embedded as the embedding model does."""
    step = decode_step.decode_step_inputs(loaded)
    ids = step.pop("input_ids")
    mode = eager_forwards(loaded)
    with mode, torch.no_grad():
        embedded = embedding(ids)
    cache = step.pop(decode_step.cache_argument(loaded.model))
    return {"inputs_embeds": embedded["inputs_embeds"], "attention_mask": step["attention_mask"],
            "position_ids": step["position_ids"], "past_key_values": cache,
            **({PER_LAYER: embedded[PER_LAYER]} if PER_LAYER in embedded else {})}


def embedded_decoder_programs(
    loaded: LoadedModel, options: fx2onnx.ExportOptions, embedding: torch.nn.Module | None = None,
) -> tuple[fx2onnx.ONNXProgram, fx2onnx.ONNXProgram]:
    """The programs of Transformers.js's `embed_tokens` and `decoder_model_merged` of ``loaded``'s
    text model (``options``: those of the decoder); ``embedding``: the model's own (`input_ids` ->
    `inputs_embeds` and `per_layer_inputs`: Gemma 3n's embeds its vision and audio vocabularies
    otherwise), else `PerLayerEmbedding`."""
    embedding = embedding if embedding is not None else PerLayerEmbedding(loaded.model).eval()
    decoder = PerLayerDecoder(loaded.model).eval()
    vocab = int(decode_step.decoder_sizes(loaded.config).vocab_size)
    ids = torch.randint(min(3, vocab - 1), vocab, (2, 9), generator=torch.Generator().manual_seed(0))
    if loaded.fake_context is not None:
        ids = fake_copy(loaded.fake_context.fake_mode, ids)
    # the embedding has no attention: no causal mask to find
    embed_program = exported(embedding, {"input_ids": ids}, dataclasses.replace(options, causal_mask_input=None))
    roles = {name: {0: BATCH, 1: SEQUENCE} for name in ("inputs_embeds", PER_LAYER)}
    inputs = _decoder_inputs(loaded, embedding)  # the prefill runs the whole model, with its own masks
    with masks_by_held_tokens(decoder.text_model()):
        decoder_program = exported(decoder, inputs, options, roles)
    return embed_program, decoder_program


def write_embedded_decoder(
    loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, quantization: Any = None,
) -> list[str]:
    """Export and write Transformers.js's `embed_tokens` and `decoder_model_merged` into
    ``staging`` (``options``: those of the folder's model); returns their paths and data files."""
    embed_program, decoder_program = embedded_decoder_programs(loaded, options)
    files = []
    for program, base in ((embed_program, EMBEDDING), (decoder_program, folder_layout.MERGED_DECODER)):
        files += save_program(program, staging, onnx_file(loaded, base, quantization), loaded)
    return files
