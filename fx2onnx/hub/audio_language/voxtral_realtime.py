"""VoxtralRealtime's streaming folder, as Transformers.js's
VoxtralRealtimeForConditionalGeneration runs it (dist/transformers.node.mjs lines 31482-31648):

- `audio_encoder`: one chunk of mel frames at a time. Inputs `input_features` [1, mel bins,
  frames], `attention_mask` [1, encoder positions so far], `position_ids` [1, new encoder
  positions], `past_padding_cache` [1, mel bins + audio width, 2] and the encoder's own
  `past_key_values.*`; outputs `audio_embeds` [1, frames / 8, text width] (the projector's),
  `present_padding_cache` and `present.*`. The padding cache is the left context of the
  two causal convolutions: its first `num_mel_bins` channels hold the last 2 mel frames
  (conv1's left padding), the rest the last 2 columns of conv1's output, of which conv2 (left
  padding 1) reads the last. Fed zeros first, as transformers pads an unstreamed clip.
  Attention is causal over the chunks so far, within the encoder's sliding window counted in
  held positions (decoders/sliding_window.py): the cache grows, as the client feeds it.
- `embed_tokens`: the token embedding (the client adds each audio embedding to one token's).
- `decoder_model_merged`: the language model and head over `inputs_embeds`, `attention_mask` and
  the cache (no `position_ids`: the client feeds none, so positions are counted from the mask), its layers'
  delay conditioning (the time embedding of `default_num_delay_tokens` through each layer's
  ada RMS norm) computed inside, as transformers does when no `num_delay_tokens` is given.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.export import Dim

import fx2onnx
from fx2onnx.hub.decoders import decode_step
from fx2onnx.hub.decoders.sliding_window import growing_cache, masks_for
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.vision_language import parts as shared

CONV1_LEFT, CONV2_LEFT = 2, 1  # the causal convolutions' left padding (kernel 3; strides 1 and 2)
PADDING_COLUMNS = 2  # the client's padding cache: [1, mel bins + audio width, 2]
# mel frames of the capture's first chunk and of the chunk it captures (multiples of 8, the latter of 2 tokens
# or more: a length of 1 would be fixed)
EXAMPLE_CHUNKS = (24, 16)


def zero_padding_cache(config: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The padding cache of a stream's first chunk: zeros (the convolutions' left padding)."""
    audio = config.audio_config
    return torch.zeros(1, int(audio.num_mel_bins) + int(audio.hidden_size), PADDING_COLUMNS, dtype=dtype)


def encoder_positions(frames: int) -> int:
    """Encoder positions of a chunk of ``frames`` mel frames (after conv2's stride 2)."""
    return (CONV2_LEFT + frames - 3) // 2 + 1


class StreamingEncoder(torch.nn.Module):
    """The audio tower over one chunk with its padding cache and key/value cache, then the
    projector (held as `model`, so the weights keep the checkpoint's names)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = shared.Holder(audio_tower=model.model.audio_tower, multi_modal_projector=model.model.multi_modal_projector)
        self.config = model.config

    def forward(self, input_features: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                past_padding_cache: torch.Tensor, past_key_values: Any) -> dict[str, Any]:
        tower, audio = self.model.audio_tower, self.config.audio_config
        bins = int(audio.num_mel_bins)
        # each causal convolution reads its cached left context then the chunk (nn.Conv1d's own
        # forward: the module's would pad with zeros or keep its cache in Python)
        padded_features = torch.cat([past_padding_cache[:, :bins, PADDING_COLUMNS - CONV1_LEFT:], input_features], dim=-1)
        hidden = torch.nn.functional.gelu(torch.nn.Conv1d.forward(tower.embedder.conv1, padded_features))
        padded_hidden = torch.cat([past_padding_cache[:, bins:, PADDING_COLUMNS - CONV2_LEFT:], hidden], dim=-1)
        embeds = torch.nn.functional.gelu(torch.nn.Conv1d.forward(tower.embedder.conv2, padded_hidden)).permute(0, 2, 1)
        present_padding = torch.cat([padded_features[:, :, -PADDING_COLUMNS:], padded_hidden[:, :, -PADDING_COLUMNS:]], dim=1)
        dtype = embeds.dtype
        mask = masks_for(audio, attention_mask, embeds.shape[1], dtype)
        output = tower(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids,
                       cache=past_key_values, use_cache=True)
        hidden_states = output.last_hidden_state
        stacked = hidden_states.reshape(1, -1, int(audio.hidden_size) * int(self.config.downsample_factor))
        return {"audio_embeds": self.model.multi_modal_projector(stacked), "present_padding_cache": present_padding,
                "present": decode_step.output_cache(output)}


def delay_conditioning(time_embedding: torch.nn.Module, delay: float, dtype: torch.dtype) -> torch.Tensor:
    """The decoder layers' time conditioning at ``delay`` tokens, as transformers computes it
    from `num_delay_tokens` (the config's default when none is given): [1, 1, text width]."""
    return time_embedding(torch.full((1,), delay, dtype=dtype))[None, None]


class DelayedDecoder(shared.LanguageModelWithHead):
    """The language model and head over `inputs_embeds` and the cache, each layer conditioned
    on the default delay (its ada RMS norm's input), windows counted in held tokens."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self.time_embedding = model.model.time_embedding  # no weights: its frequencies are computed
        self.delay = float(model.config.default_num_delay_tokens)
        self.text_config = model.config.text_config

    def forward(self, inputs_embeds, attention_mask, past_key_values) -> dict[str, Any]:
        # the client feeds no position_ids (its forward passes only the generation's inputs_embeds,
        # attention_mask and cache): each token's position is the count of held tokens before it, as
        # transformers' generate makes them from the mask
        held = attention_mask.to(torch.int64).cumsum(-1) - 1
        position_ids = held[:, held.shape[1] - inputs_embeds.shape[1]:].clamp(min=0)
        conditioning = delay_conditioning(self.time_embedding, self.delay, inputs_embeds.dtype)
        mask = masks_for(self.text_config, attention_mask, inputs_embeds.shape[1], inputs_embeds.dtype)
        output = self.model.language_model(
            inputs_embeds=inputs_embeds, attention_mask=mask, position_ids=position_ids, use_cache=True,
            t_cond=conditioning, **{self.cache_argument: past_key_values},
        )
        return self.logits_and_cache(output)


def _decoder_inputs(model: torch.nn.Module) -> dict[str, Any]:
    """A decode step after a prefill over a cache that grows in every layer (sizes as causal_lm's)."""
    config = model.config.text_config
    batch, cached, new = decode_step.BATCH, decode_step.CACHED_TOKENS, decode_step.NEW_TOKENS
    embeds = torch.randn(batch, cached + new, int(config.hidden_size), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(batch, cached + new, dtype=torch.int64)
    positions = torch.arange(cached + new).expand(batch, -1).contiguous()
    cache = growing_cache(config)
    with torch.no_grad():
        prefill = model.model.language_model(
            inputs_embeds=embeds[:, :cached], attention_mask=masks_for(config, mask[:, :cached], cached, embeds.dtype),
            position_ids=positions[:, :cached], use_cache=True,
            t_cond=delay_conditioning(model.model.time_embedding, float(model.config.default_num_delay_tokens), embeds.dtype),
            **({"cache": cache} if cache is not None else {}),
        )
    return {"inputs_embeds": embeds[:, cached:], "attention_mask": mask, "past_key_values": decode_step.output_cache(prefill)}


def encoder_step(encoder: StreamingEncoder, features: torch.Tensor, padding: torch.Tensor, cache: Any,
                 past: int) -> dict[str, Any]:
    """``encoder`` over one chunk of ``features`` after ``past`` encoder positions: the client's feed."""
    new = encoder_positions(features.shape[-1])
    return {"input_features": features, "attention_mask": torch.ones(1, past + new, dtype=torch.int64),
            "position_ids": torch.arange(past, past + new)[None], "past_padding_cache": padding, "past_key_values": cache}


def _encoder_inputs(model: torch.nn.Module, encoder: StreamingEncoder) -> dict[str, Any]:
    """The second chunk's feed after a first one (the key/value cache and padding cache filled)."""
    config = model.config
    first, second = EXAMPLE_CHUNKS
    features = torch.randn(1, int(config.audio_config.num_mel_bins), first + second, generator=torch.Generator().manual_seed(0))
    cache = growing_cache(config.audio_config)
    if cache is None:
        from transformers import DynamicCache

        cache = DynamicCache(config=config.audio_config)
    with torch.no_grad():
        output = encoder(**encoder_step(encoder, features[..., :first], zero_padding_cache(config), cache, 0))
    return encoder_step(encoder, features[..., first:], output["present_padding_cache"], output["present"],
                        encoder_positions(first))


def _one_clip(spec: Any) -> Any:
    """``spec`` (a cache's dynamic shapes) with its batch dim static."""
    if isinstance(spec, dict):
        return {index: dim for index, dim in spec.items() if index != 0}
    return [_one_clip(child) for child in spec] if isinstance(spec, (list, tuple)) else spec


def export_parts(loaded: LoadedModel, options: fx2onnx.ExportOptions) -> dict[str, fx2onnx.ONNXProgram]:
    """The "audio", "embedding" and "decoder" programs of ``loaded``'s VoxtralRealtime."""
    model = loaded.model
    encoder = StreamingEncoder(model).eval()
    inputs = _encoder_inputs(model, encoder)
    # one clip (the client streams one): its frames, positions and cached positions dynamic
    dynamic = {"input_features": {2: Dim.AUTO}, "attention_mask": {1: Dim.AUTO}, "position_ids": {1: Dim.AUTO},
               "past_padding_cache": None,
               "past_key_values": _one_clip(shared.decoder_dynamic_shapes(inputs)["past_key_values"])}
    audio_options = dataclasses.replace(shared.without_causal_mask(options), dynamic_shapes=dynamic)
    programs = {"audio": fx2onnx.dynamo_export(encoder, **inputs, export_options=audio_options)}
    programs["embedding"] = shared.export_token_embedding(loaded, options)
    decoder_inputs = _decoder_inputs(model)
    decoder_options = dataclasses.replace(
        shared.without_causal_mask(options), dynamic_shapes=shared.decoder_dynamic_shapes(decoder_inputs),
    )
    programs["decoder"] = fx2onnx.dynamo_export(DelayedDecoder(model).eval(), **decoder_inputs, export_options=decoder_options)
    return programs
