"""Gemma 4 as Transformers.js runs it (ONNX Runtime GenAI has no Gemma 4 vision type).

Transformers.js's Gemma4ForConditionalGeneration (its Gemma3nForConditionalGeneration,
src/models/gemma3n/modeling_gemma3n.js) loads four models (src/models/session_config.js:78-90,
the image-audio-text-to-text sessions): it runs `embed_tokens` on a step's ids for
`inputs_embeds` and `per_layer_inputs`, copies the vision model's rows over the image tokens'
rows and the audio model's over the audio tokens' (default_merge_input_ids_with_features:
their counts must be equal), and feeds the decoder `inputs_embeds`, `per_layer_inputs`,
`attention_mask`, `position_ids` (from 0) and the cache, as transformers' Gemma4Model runs its
language model once it has merged the features. So:

- vision_encoder (`pixel_values` [images, patches, 3 * patch ** 2], `pixel_position_ids`
  [images, patches, 2], -1 at padding -> `image_features` [tokens, hidden]): the tower on the
  processor's padded patches and the embedder into the text model's width, the padding's
  pooled rows dropped (the tower's own `pooler_mask`): one row per image token, for any image
  size the processor gives (its aspect ratio kept, the token count varying with it). The
  patches' count is the image processor's (`max_soft_tokens` times the pooling window's
  patches, as Transformers.js's Gemma4ImageProcessor pads them too): the tower's pooling sizes
  a one-hot by it, which the capture keeps as a number;
- audio_encoder (`input_features` [clips, frames, mel bins], `input_features_mask` ->
  `audio_features` [tokens, hidden]): the conformer and its embedder, the rows past each
  clip's end dropped (the tower's own output mask), as transformers merges them;
- embed_tokens and decoder_model_merged: the text-generation folder's pair
  (decoders/per_layer_inputs.py): the embedding of the ids with image, video and audio
  tokens embedded as padding, and the text model adding the projection of the merged
  embeddings to the per-layer inputs itself.

Not served (refused before anything is written): a model without a vision tower (nothing to
run on images) or without an audio tower (Transformers.js loads `onnx/audio_encoder.onnx`
for this class whatever the prompt holds), and one whose image tokens attend each other
both ways (`use_bidirectional_attention: "vision"`: transformers reads that from
`mm_token_type_ids`, which Transformers.js's forward does not feed the decoder).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import fx2onnx
from fx2onnx.hub.decoders.client_support import TRANSFORMERS_JS
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.shared.verification import cpu_session, run_session
from fx2onnx.hub.vision_language import gemma3n
from fx2onnx.hub.vision_language.architecture import Prompt, VisionLanguageArchitecture, prompt_text, transformers_js_only
from fx2onnx.hub.vision_language.parts import Holder

class Gemma4Vision(torch.nn.Module):
    """The vision tower and its embedder: one row per image token of every image."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = Holder(vision_tower=model.model.vision_tower, embed_vision=model.model.embed_vision)

    def forward(self, pixel_values: torch.Tensor, pixel_position_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        # the tower drops the padding's pooled rows itself: its rows are the images' tokens, in order
        hidden = self.model.vision_tower(pixel_values=pixel_values, pixel_position_ids=pixel_position_ids).last_hidden_state
        return {"image_features": self.model.embed_vision(inputs_embeds=hidden)}


class Gemma4Audio(torch.nn.Module):
    """The audio tower and its embedder: one row per audio token of every clip."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = Holder(audio_tower=model.model.audio_tower, embed_audio=model.model.embed_audio)

    def forward(self, input_features: torch.Tensor, input_features_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        output = self.model.audio_tower(input_features, input_features_mask, return_dict=True)
        # the rows past each clip's end are not merged (transformers' Gemma4Model.forward drops them)
        return {"audio_features": self.model.embed_audio(inputs_embeds=output.last_hidden_state)[output.attention_mask]}


def check(config: Any) -> None:
    """A clear error for a Gemma 4 whose folder Transformers.js could not run as transformers does."""
    if getattr(config, "vision_config", None) is None:
        raise NotImplementedError(
            "The model has no vision tower (vision_config is null): there is no image-text-to-text folder to write. "
            "Nothing was written."
        )
    if getattr(config, "audio_config", None) is None:
        raise NotImplementedError(
            f"The model has no audio tower (audio_config is null), and {TRANSFORMERS_JS} loads onnx/audio_encoder.onnx "
            "for Gemma4ForConditionalGeneration whatever the prompt holds (src/models/session_config.js:78-90, the "
            "image-audio-text-to-text sessions; src/models/registry.js:634-640), so a folder without one does not load "
            "(ModelFileNotFoundError for onnx/audio_encoder.onnx). Nothing was written."
        )
    if getattr(config.get_text_config(), "use_bidirectional_attention", None) == "vision":
        raise NotImplementedError(
            "The model's image tokens attend each other both ways (use_bidirectional_attention: \"vision\"), which "
            f"transformers reads from mm_token_type_ids; {TRANSFORMERS_JS}'s Gemma4ForConditionalGeneration feeds its "
            "decoder inputs_embeds, per_layer_inputs, attention_mask, position_ids and the cache alone "
            "(src/models/gemma3n/modeling_gemma3n.js:78-91), so its image tokens would attend causally. Nothing was written."
        )


def export_parts(loaded: LoadedModel, options: fx2onnx.ExportOptions, image_processor: Any,
                 architecture: VisionLanguageArchitecture) -> dict[str, fx2onnx.ONNXProgram]:
    """The vision and audio models for any number of images and clips, the embedding and the decoder."""
    images = gemma3n.processed_images(image_processor)
    vision = {"pixel_values": images["pixel_values"], "pixel_position_ids": images["image_position_ids"]}
    # the patches' count stays the processor's (max_soft_tokens pooled tokens): the tower's pooling sizes its one-hot
    # by it, which the capture keeps as a number; another count is an error of onnxruntime's, not other numbers
    return gemma3n.tower_and_text_programs(loaded, options, (Gemma4Vision(loaded.model), vision),
                                           (Gemma4Audio(loaded.model), gemma3n.audio_inputs()))


def verification_sizes(model: torch.nn.Module, image_processor: Any) -> tuple[tuple[int, int], ...]:
    """Two images of other sizes and aspect ratios (a wide and a wider one), neither a multiple of the pooled patch."""
    return (45, 70), (25, 90)


def image_tokens(config: Any, count: int) -> list[int]:
    """An image's tokens as Gemma 4's processor lays them out: begin, ``count`` image tokens, end."""
    return [int(config.boi_token_id), *[int(config.image_token_id)] * count, int(config.eoi_token_id)]


def verification_prompt(model: torch.nn.Module, images: dict[str, torch.Tensor]) -> Prompt:
    """Each image's tokens between random text tokens; positions from 0, as both give them."""
    config = model.config
    special = {int(getattr(config, name)) for name in ("image_token_id", "boi_token_id", "eoi_token_id", "audio_token_id",
                                                       "video_token_id") if getattr(config, name, None) is not None}
    text = prompt_text(config, special)
    outputs = model.model.get_image_features(images["pixel_values"], images["image_position_ids"]).pooler_output
    first, second = (image_tokens(config, int(features.shape[0])) for features in outputs)
    ids = torch.tensor([text[:3] + first + text[3:6] + second + text[6:9]])
    return Prompt(ids, {"pixel_values": images["pixel_values"], "image_position_ids": images["image_position_ids"]},
                  torch.cat(outputs), np.arange(ids.shape[1], dtype=np.int64)[None],
                  lambda index: np.array([[index]], dtype=np.int64))


def image_features(vision: Any, images: dict[str, torch.Tensor]) -> np.ndarray:
    """The vision model on every image in one run, as Transformers.js runs it."""
    feed = {"pixel_values": images["pixel_values"].numpy(), "pixel_position_ids": images["image_position_ids"].numpy()}
    return run_session(vision, feed)["image_features"]


def audio_pairs(files: dict[str, Any], model: torch.nn.Module) -> list[tuple[np.ndarray, torch.Tensor]]:
    """The audio model in onnxruntime beside transformers' merged rows (get_audio_features, the
    rows past each clip's end dropped) on two clips of other lengths than the export's."""
    clips = gemma3n.audio_inputs(frames=157, held=61, seed=1)
    with torch.no_grad():
        output = model.model.get_audio_features(clips["input_features"], clips["input_features_mask"], return_dict=True)
    with cpu_session(files["audio"]) as audio:
        got = run_session(audio, {name: value.numpy() for name, value in clips.items()})["audio_features"]
    return [(got, output.pooler_output[output.attention_mask])]


ARCHITECTURE = transformers_js_only(
    "Gemma 4 vision-language", export_parts=export_parts, verification_sizes=verification_sizes,
    verification_prompt=verification_prompt, image_features=image_features, mrope=False, check=check,
    more_pairs=audio_pairs,
)
