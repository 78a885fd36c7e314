"""Gemma 3n as Transformers.js runs it (ONNX Runtime GenAI has no Gemma 3n type).

Transformers.js's Gemma3nForConditionalGeneration (src/models/gemma3n/modeling_gemma3n.js) loads
four models whatever the prompt holds (src/models/session_config.js:78-90, the
image-audio-text-to-text sessions). It runs `embed_tokens` on a step's ids for `inputs_embeds` and
`per_layer_inputs`, feeds the vision model `pixel_values` alone (its `_encode_vision`), copies its
rows over the image tokens' rows and the audio model's over the audio tokens'
(default_merge_input_ids_with_features: their counts must be equal), and feeds the decoder
`inputs_embeds`, `per_layer_inputs`, `attention_mask`, `position_ids` and the cache, as
transformers' Gemma3nModel runs its language model once it has merged the features. So:

- vision_encoder (`pixel_values` [images, 3, height, width] of the image processor's one size ->
  `image_features` [images, vision_soft_tokens_per_image, hidden]): timm's MobileNetV5 (the
  tower transformers builds through TimmWrapperModel, unpooled), its map scaled by the square
  root of its width and the embedder into the text model's width;
- audio_encoder (`input_features` [clips, frames, mel bins], `input_features_mask`, true at a
  clip's frames -> `audio_features` [clips, audio_soft_tokens_per_image, hidden]): the USM
  conformer and its embedder, each clip's rows past its end and up to the processor's fixed
  count of audio tokens the embedding of the audio vocabulary's last token, as transformers
  merges them (its processor writes audio_soft_tokens_per_image audio tokens a clip, whatever
  its length);
- embed_tokens: the text model's scaled embedding of the ids, the ids of the vision and audio
  vocabularies (the image and audio tokens, and the tokens ending an image or a clip) by the
  embedders' own tables, and the token part of the per-layer inputs (ids past that table's as
  id 0), as Gemma3nModel.forward embeds them;
- decoder_model_merged: the text model from those (it adds the projection of the merged
  embeddings to the per-layer inputs itself), its head and the logits' soft cap
  (decoders/per_layer_inputs.py), the cache of the layers that reuse an earlier layer's left
  out (Transformers.js feeds every layer's and leaves the ones the decoder does not take).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from torch.export import Dim

import fx2onnx
from fx2onnx.hub.decoders.per_layer_inputs import PER_LAYER, embedded_decoder_programs
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.shared.verification import cpu_session, run_session
from fx2onnx.hub.vision_language import parts
from fx2onnx.hub.vision_language.architecture import Prompt, VisionLanguageArchitecture, prompt_text, transformers_js_only
from fx2onnx.hub.vision_language.parts import Holder


class Gemma3nVision(torch.nn.Module):
    """The timm tower and the vision embedder: a row per image token of every image."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = Holder(vision_tower=model.model.vision_tower, embed_vision=model.model.embed_vision)
        self.width = int(model.config.vision_config.hidden_size)
        self.tokens = int(model.config.vision_soft_tokens_per_image)

    def forward(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        mapped = self.model.vision_tower(pixel_values=pixel_values, do_pooling=False, return_dict=True).last_hidden_state
        # [images, width, rows, columns] -> a row per position, scaled as Gemma3nModel.get_image_features scales it
        rows = mapped.reshape(mapped.shape[0], self.width, self.tokens).permute(0, 2, 1) * self.width ** 0.5
        return {"image_features": self.model.embed_vision(inputs_embeds=rows)}


class Gemma3nAudio(torch.nn.Module):
    """The conformer and the audio embedder: the processor's count of rows per clip."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = Holder(audio_tower=model.model.audio_tower, embed_audio=model.model.embed_audio)
        self.tokens = int(model.config.audio_soft_tokens_per_image)
        # transformers pads with the embedding of the text vocabulary's last id (the audio vocabulary's last token)
        self.padding_id = int(model.config.text_config.vocab_size) - 1

    def forward(self, input_features: torch.Tensor, input_features_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        # the tower takes the padding's mask (true past a clip's end) and gives it subsampled beside its rows
        output = self.model.audio_tower(input_features, ~input_features_mask, return_dict=True)
        rows = self.model.embed_audio(inputs_embeds=output.last_hidden_state)
        padding_id = torch.full((1, 1), self.padding_id, dtype=torch.int64, device=rows.device)
        padding = self.model.embed_audio(input_ids=padding_id)
        rows = torch.where(output.audio_mel_mask.unsqueeze(-1), padding, rows)
        # up to the processor's count of audio tokens; a clip of the feature extractor's longest (30 s) gives that count
        filled = torch.cat([rows, padding.expand(rows.shape[0], self.tokens, rows.shape[-1])], dim=1)
        return {"audio_features": filled[:, :self.tokens]}


class Gemma3nEmbedding(torch.nn.Module):
    """`input_ids` -> `inputs_embeds` (the vision and audio vocabularies' ids by their embedders)
    and the token part of the per-layer inputs."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        text = model.model.language_model
        self.model = Holder(
            language_model=Holder(embed_tokens=text.embed_tokens, embed_tokens_per_layer=text.embed_tokens_per_layer),
            embed_vision=model.model.embed_vision, embed_audio=model.model.embed_audio,
        )
        config = text.config
        self.layers, self.size = int(config.num_hidden_layers), int(config.hidden_size_per_layer_input)
        self.per_layer_vocab = int(config.vocab_size_per_layer_input)

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        held = self.model
        embeds = held.language_model.embed_tokens(input_ids)
        vision, audio = held.embed_vision, held.embed_audio
        for embedder, inside in ((vision, (input_ids >= vision.vocab_offset) & (input_ids < audio.vocab_offset)),
                                 (audio, input_ids >= audio.vocab_offset)):
            # elsewhere the embedder's last id: any id of its table (the rows it gives there are not kept)
            ids = torch.where(inside, input_ids, embedder.vocab_offset + embedder.vocab_size - 1)
            embeds = torch.where(inside.unsqueeze(-1), embedder(input_ids=ids), embeds)
        in_table = (input_ids >= 0) & (input_ids < self.per_layer_vocab)
        per_layer = held.language_model.embed_tokens_per_layer(torch.where(in_table, input_ids, 0))
        return {"inputs_embeds": embeds, PER_LAYER: per_layer.reshape(*input_ids.shape, self.layers, self.size)}


def processed_images(image_processor: Any) -> dict[str, torch.Tensor]:
    """The processor's output for two random images of other sizes and aspect ratios (Gemma 3n's
    and Gemma 4's processors)."""
    from fx2onnx.hub.vision_language.folder_verification import random_images

    return image_processor(images=random_images(((30, 50), (20, 90))), return_tensors="pt")


def audio_inputs(frames: int = 120, held: int = 90, seed: int = 0) -> dict[str, torch.Tensor]:
    """Two clips of ``frames`` log-mel frames, the second's end masked after ``held`` (the
    conformer's attention pads its frames to whole chunks, by none where they fill them: the
    capture pads always, capture/libraries/transformers_audio_chunks.py). Gemma 4's audio model
    takes the same (its subsampling's projection is sized for 128 bins too)."""
    bins = 128  # the mel bins of Gemma 3n's feature extractor, which the subsampling is sized for (input_feat_size)
    features = torch.randn(2, frames, bins, generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(2, frames, dtype=torch.bool)
    mask[1, held:] = False
    return {"input_features": features, "input_features_mask": mask}


def tower_and_text_programs(
    loaded: LoadedModel, options: fx2onnx.ExportOptions, vision: tuple[torch.nn.Module, dict[str, torch.Tensor]],
    audio: tuple[torch.nn.Module, dict[str, torch.Tensor]], embedding: torch.nn.Module | None = None,
) -> dict[str, fx2onnx.ONNXProgram]:
    """The programs of the four models Transformers.js's Gemma3nForConditionalGeneration loads (and
    Gemma 4's, its subclass): the vision model for any number of images and the audio model for any
    number of clips of any length (each a module and its example inputs, their other dims as the
    example's), without the decoder's causal mask; the embedding (``embedding``, else
    decoders/per_layer_inputs.py's) and the decoder."""
    embed_program, decoder_program = embedded_decoder_programs(loaded, options, embedding)
    plain = parts.without_causal_mask(options)
    programs = {}
    for part, (module, inputs), dims in (("vision", vision, {0: Dim.AUTO}), ("audio", audio, {0: Dim.AUTO, 1: Dim.AUTO})):
        part_options = dataclasses.replace(plain, dynamic_shapes={name: dims for name in inputs})
        # fake inputs with their sizes as numbers (the other dims static)
        programs[part] = fx2onnx.dynamo_export(module, **parts.as_loaded(inputs, loaded, static=True),
                                               export_options=part_options)
    return {**programs, "embedding": embed_program, "decoder": decoder_program}


def export_parts(loaded: LoadedModel, options: fx2onnx.ExportOptions, image_processor: Any,
                 architecture: VisionLanguageArchitecture) -> dict[str, fx2onnx.ONNXProgram]:
    """The vision model for any number of images of the processor's size (the image size static: the
    tower's pooling to its output map is sized by it), the audio model for any number of clips of
    any length, the embedding and the decoder."""
    vision = {"pixel_values": processed_images(image_processor)["pixel_values"]}
    return tower_and_text_programs(loaded, options, (Gemma3nVision(loaded.model), vision),
                                   (Gemma3nAudio(loaded.model), audio_inputs()), Gemma3nEmbedding(loaded.model).eval())


def verification_sizes(model: torch.nn.Module, image_processor: Any) -> tuple[tuple[int, int], ...]:
    """Two images of other sizes and aspect ratios (the processor resizes both to its one size)."""
    return (45, 70), (90, 25)


def image_tokens(config: Any) -> list[int]:
    """An image's tokens as Gemma 3n's processor lays them out: begin, the image tokens, end."""
    return [int(config.boi_token_id), *[int(config.image_token_id)] * int(config.vision_soft_tokens_per_image),
            int(config.eoi_token_id)]


def verification_prompt(model: torch.nn.Module, images: dict[str, torch.Tensor]) -> Prompt:
    """Each image's tokens between random text tokens; positions from 0, as both give them."""
    config = model.config
    special = {int(getattr(config, name)) for name in ("image_token_id", "boi_token_id", "eoi_token_id", "audio_token_id",
                                                       "boa_token_id", "eoa_token_id")}
    # text tokens of the text vocabulary (the vision and audio vocabularies' are embedded by their embedders)
    text = [t for t in prompt_text(config, special) if t < int(config.vision_config.vocab_offset)]
    features = model.model.get_image_features(images["pixel_values"]).pooler_output
    ids = torch.tensor([text[:3] + image_tokens(config) + text[3:6] + image_tokens(config) + text[6:9]])
    return Prompt(ids, {"pixel_values": images["pixel_values"]}, features.reshape(-1, features.shape[-1]),
                  np.arange(ids.shape[1], dtype=np.int64)[None], lambda index: np.array([[index]], dtype=np.int64))


def image_features(vision: Any, images: dict[str, torch.Tensor]) -> np.ndarray:
    """The vision model on every image in one run, as Transformers.js runs it: a row per image token."""
    features = run_session(vision, {"pixel_values": images["pixel_values"].numpy()})["image_features"]
    return features.reshape(-1, features.shape[-1])


def merged_audio_rows(model: torch.nn.Module, clips: dict[str, torch.Tensor]) -> torch.Tensor:
    """The rows transformers' Gemma3nModel.forward puts at the audio tokens of a prompt holding
    each clip's (its language model's `inputs_embeds` there, caught on their way in)."""
    config = model.config
    ids = torch.full((1, clips["input_features"].shape[0] * int(config.audio_soft_tokens_per_image)),
                     int(config.audio_token_id))
    caught = {}

    def catch(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        caught["rows"] = kwargs["inputs_embeds"]

    hook = model.model.language_model.register_forward_pre_hook(catch, with_kwargs=True)
    try:
        with torch.no_grad():
            model.model(input_ids=ids, attention_mask=torch.ones_like(ids), **clips)
    finally:
        hook.remove()
    return caught["rows"].reshape(clips["input_features"].shape[0], -1, caught["rows"].shape[-1])


def audio_pairs(files: dict[str, Any], model: torch.nn.Module) -> list[tuple[np.ndarray, torch.Tensor]]:
    """The audio model in onnxruntime beside the rows transformers merges, on two batches of clips
    of other lengths than the export's (each with a clip cut short: padded frames), the second's
    subsampled frames a whole number of the attention's chunks (no padding there)."""
    pairs = []
    with cpu_session(files["audio"]) as audio:
        for frames, held, seed in ((157, 61, 1), (96, 50, 2)):
            clips = audio_inputs(frames, held, seed)
            got = run_session(audio, {name: value.numpy() for name, value in clips.items()})["audio_features"]
            pairs.append((got, merged_audio_rows(model, clips)))
    return pairs


ARCHITECTURE = transformers_js_only(
    "Gemma 3n vision-language", export_parts=export_parts, verification_sizes=verification_sizes,
    verification_prompt=verification_prompt, image_features=image_features, mrope=False, more_pairs=audio_pairs,
)
