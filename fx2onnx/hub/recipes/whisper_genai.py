"""Whisper as ONNX Runtime GenAI runs it (`model.type` "whisper"): two models, each
exported from the model's own modules.

- The encoder: `audio_features` (batch, mel bins, 3000 frames: the runtime's fixed
  30 s) -> `encoder_hidden_states` (batch, 1500, d_model) and, for each decoder layer,
  the cross-attention cache its `encoder_attn` computes from them once:
  `present_key_cross_{i}` / `present_value_cross_{i}` (batch, heads, 1500, head size).
- The decoder, one model for the prompt and the next tokens: `input_ids`,
  `past_key_self_{i}` / `past_value_self_{i}` (batch, heads, past, head size; a past of
  length 0 is the prompt), `past_key_cross_{i}` / `past_value_cross_{i}` -> `logits`,
  `present_key_self_{i}` / `present_value_self_{i}`. It takes no `encoder_hidden_states`:
  the runtime feeds the encoder's cross caches instead (whisper.cpp does when the
  encoder has those outputs). The cross-attention reads them as transformers' own
  `EncoderDecoderCache` marked as filled, so the model's code takes its "reuse the
  cross-attention cache" path. The logits carry the generation config's
  `suppress_tokens` and `begin_suppress_tokens` as -inf (whisper_suppress.py): the
  runtime has no option for them.

The config files the runtime reads beside them are written by whisper_config.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import onnx_ir as ir
import torch
from torch import nn

import fx2onnx
from fx2onnx.hub.shared import folder_layout
from fx2onnx.hub.decoders.decode_step import cache_argument
from fx2onnx.hub.shared.dim_roles import name_dims_by_role
from fx2onnx.hub.loading import LoadedModel, eager_forwards
from fx2onnx.hub.precision.folder_precision import FLOAT_ONLY, precision_refusal
from fx2onnx.hub.recipes.folder_recipe import RecipeDefaults, Say
from fx2onnx.hub.request import ExportRequest, Refusal
from fx2onnx.hub.shared.json_files import write_json_file
from fx2onnx.hub.shared.program_files import onnx_file, save_program
from fx2onnx.hub.shared.verification import Tolerance, Verification
from fx2onnx.hub.whisper.whisper_verify import verify_whisper_genai
from fx2onnx.hub.whisper.whisper_config import (
    AUDIO_FEATURES, CROSS_PAST, CROSS_PRESENT, HIDDEN_STATES, SELF_PAST, SELF_PRESENT, audio_processor_config,
    beam_search_note, whisper_genai_config,
)
from fx2onnx.hub.whisper.whisper_suppress import SuppressedLogits, suppress_lists

# ONNX Runtime GenAI 0.18 runs Whisper on 3000 frames of features (AudioEncoderState)
RUNTIME_FRAMES = 3000
# example sizes no other dim shares: sequences, new tokens, cached tokens
BATCH_SIZE, NEW_TOKENS, CACHED_TOKENS = 2, 3, 5


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    return model.get_decoder().layers


def _heads(model: nn.Module) -> tuple[int, int]:
    """The decoder attention's heads and head size."""
    attention = _decoder_layers(model)[0].encoder_attn
    return int(attention.num_heads), int(attention.head_dim)


class _WithCheckpointNames(nn.Module):
    """Holds the model's children under their own names, so that the parameter names are
    the checkpoint's (`model.encoder...`, as fake mode needs to stream the weights from
    the folder), and the model itself outside the module tree, to call it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        for name, child in model.named_children():
            self.add_module(name, child)
        self._whole = (model,)  # a tuple: not registered as a submodule

    @property
    def whole(self) -> nn.Module:
        return self._whole[0]


class GenAIWhisperEncoder(_WithCheckpointNames):
    """The encoder and the decoder layers' cross-attention keys and values of its output."""

    def forward(self, audio_features: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden = self.whole.get_encoder()(input_features=audio_features).last_hidden_state
        caches = []
        for layer in _decoder_layers(self.whole):
            attention = layer.encoder_attn
            shape = (hidden.shape[0], -1, attention.num_heads, attention.head_dim)
            # as the attention computes them before caching them (its k_proj has no bias, v_proj has one)
            caches += [attention.k_proj(hidden).view(shape).transpose(1, 2), attention.v_proj(hidden).view(shape).transpose(1, 2)]
        return (hidden, *caches)


class GenAIWhisperDecoder(_WithCheckpointNames):
    """A decoding step over the self-attention cache and the encoder's cross-attention cache,
    given as flat tensors: keys and values of each layer, self first, then cross. Its logits
    carry the generation config's suppress lists (whisper_suppress.py)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        suppress, begin_suppress = suppress_lists(getattr(model, "generation_config", None))
        self._suppressed = (SuppressedLogits(int(model.config.vocab_size), suppress, begin_suppress),)  # no parameters

    def forward(self, input_ids: torch.Tensor, *caches: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        layers = len(caches) // 4
        self_cache, cross_cache = DynamicCache(), DynamicCache()
        for index in range(layers):
            self_cache.update(caches[2 * index], caches[2 * index + 1], index)
            cross_cache.update(caches[2 * layers + 2 * index], caches[2 * layers + 2 * index + 1], index)
        cache = EncoderDecoderCache(self_cache, cross_cache)
        for index in range(layers):
            cache.is_updated[index] = True  # the cross-attention reads the cache and never the encoder's output
        # the decoder runs its cross-attention when given an encoder output; the cache replaces its use
        placeholder = caches[2 * layers]
        outputs = self.whole(decoder_input_ids=input_ids, encoder_outputs=(placeholder,), use_cache=True,
                             **{cache_argument(self.whole): cache})
        presents = []
        for layer in self_cache.layers:
            presents += [layer.keys, layer.values]
        return (self._suppressed[0](outputs.logits, caches[0]), *presents)


def _examples(loaded: LoadedModel) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The encoder's example features and the decoder's example inputs (ids, then the caches),
    fake when the model is."""
    config, model = loaded.config, loaded.model
    mode = eager_forwards(loaded)
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(BATCH_SIZE, int(config.num_mel_bins), RUNTIME_FRAMES, generator=generator).to(dtype)
    vocab = int(config.vocab_size)
    ids = torch.randint(3, vocab, (BATCH_SIZE, NEW_TOKENS), generator=generator)
    heads, head_size = _heads(model)
    layers = len(_decoder_layers(model))
    self_cache = torch.randn(2 * layers, BATCH_SIZE, heads, CACHED_TOKENS, head_size, generator=generator).to(dtype)
    with mode, torch.no_grad():
        features, ids, self_cache = features.clone(), ids.clone(), self_cache.clone()
        cross = GenAIWhisperEncoder(model)(features)[1:]
    return features, (ids, *self_cache.unbind(0), *cross)


def _name_io(model: ir.Model, inputs: list[str], outputs: list[str]) -> None:
    """Give the graph's inputs and outputs the runtime's names, in order."""
    for values, names in ((model.graph.inputs, inputs), (model.graph.outputs, outputs)):
        if len(values) != len(names):
            raise RuntimeError(
                f"The Whisper export has {len(values)} graph values where ONNX Runtime GenAI needs {len(names)} "
                f"({', '.join(names[:4])}, ...): report this with the model's config."
            )
        for value, name in zip(values, names):
            value.name = name


def _names(templates: tuple[str, str], layers: int) -> list[str]:
    return [template % index for index in range(layers) for template in templates]


def export_whisper_genai(loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, save: Any) -> list[str]:
    """Write the encoder, the decoder, genai_config.json and audio_processor_config.json
    into ``staging``; ``save(program, staging, relative path, loaded)`` saves a model and
    returns the files it wrote. Returns the files written."""
    model = loaded.model
    # first: a feature extractor the runtime cannot follow is refused before any export
    processor = audio_processor_config(loaded.folder, int(loaded.config.num_mel_bins), RUNTIME_FRAMES)
    layers = len(_decoder_layers(model))
    features, decoder_inputs = _examples(loaded)
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())

    # the frames are fixed by Whisper's code (and the runtime's 3000): only the batch is dynamic
    batch_only = dataclasses.replace(options, dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
    encoder = fx2onnx.dynamo_export(GenAIWhisperEncoder(model).eval(), features, export_options=batch_only)
    _name_io(encoder.model, [AUDIO_FEATURES], [HIDDEN_STATES, *_names(CROSS_PRESENT, layers)])
    name_dims_by_role(encoder.model)
    encoder_file = folder_layout.onnx_file(folder_layout.GENAI_ENCODER, dtype)
    files = save(encoder, staging, encoder_file, loaded)

    decoder = fx2onnx.dynamo_export(GenAIWhisperDecoder(model).eval(), *decoder_inputs, export_options=options)
    self_past, cross_past = _names(SELF_PAST, layers), _names(CROSS_PAST, layers)
    _name_io(decoder.model, ["input_ids", *self_past, *cross_past], ["logits", *_names(SELF_PRESENT, layers)])
    name_dims_by_role(decoder.model)
    decoder_file = folder_layout.onnx_file(folder_layout.GENAI_DECODER, dtype)
    files += save(decoder, staging, decoder_file, loaded)

    generation = getattr(model, "generation_config", None)
    heads, head_size = _heads(model)
    config = whisper_genai_config(loaded.config, generation, encoder_file, decoder_file, heads, head_size, layers)
    return [*files, write_json_file(staging, "genai_config.json", config),
            write_json_file(staging, "audio_processor_config.json", processor)]


class WhisperGenAIRecipe(RecipeDefaults):
    # its decoder prompt carries its special tokens: the runtime's tokenizer adds none
    special_tokens = False

    def accepts(self, loaded: LoadedModel, request: ExportRequest) -> Refusal | None:
        return precision_refusal(loaded, request, FLOAT_ONLY)

    def export(
        self, loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, request: ExportRequest, say: Say,
    ) -> list[str]:
        note = beam_search_note(getattr(loaded.model, "generation_config", None))
        if note:
            say(note)
        return export_whisper_genai(loaded, staging, options, save_program)

    def verify(
        self, loaded: LoadedModel, folder: Path, model: nn.Module, request: ExportRequest, tolerance: Tolerance,
        say: Say,
    ) -> Verification:
        files = (folder / onnx_file(loaded, folder_layout.GENAI_ENCODER), folder / onnx_file(loaded, folder_layout.GENAI_DECODER))
        return verify_whisper_genai(folder, *files, model, loaded.folder, request.tokens, tolerance)

    def generation_notes(self, folder: Path) -> list[str]:
        return []  # its beam search note is said on export; its suppress lists are in the decoder's graph


RECIPE = WhisperGenAIRecipe()
