"""Gemma 3 as Transformers.js runs it: rows one column wider than the hidden size, the last
column a flag the decoder reads to find the image tokens.

transformers lets an image's tokens attend each other both ways in the prefill (blocks from
`token_type_ids`, which its processor gives). Transformers.js's Gemma3ForConditionalGeneration
(its LlavaForConditionalGeneration) feeds the decoder `inputs_embeds`, `attention_mask`,
`position_ids` and the cache alone, and copies each image feature row over an image token's
row of `embed_tokens`' output (`default_merge_input_ids_with_features`). So the rows carry
the flag themselves:

- vision (`pixel_values` [images, 3, height, width] -> `image_features` [images, tokens,
  hidden + 1]): gemma3.py's tower and projector for the processor's one size, a column of
  ones after the features;
- embed_tokens (`input_ids` -> `inputs_embeds` [batch, tokens, hidden + 1]): the scaled token
  embedding, a column of zeros after it (an id past the vocabulary embedded as 0, as
  transformers embeds an out-of-vocabulary image token);
- decoder: the rows' last column is the image-token mask transformers builds from
  `token_type_ids` (gemma3.GemmaDecoder's blocks: each run of image rows attends itself both
  ways), the other columns the language model's embeddings. A decode step's rows are text
  (Transformers.js merges features into the first step only), whose mask is the causal one
  transformers uses after the prefill.

Transformers.js gives Gemma 3 positions from 1 (`create_position_ids`' start index), transformers
from 0: rotary attention depends on the positions' differences alone, so the scores agree up
to rounding.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

import fx2onnx
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.shared.verification import run_session
from fx2onnx.hub.vision_language import gemma3, parts
from fx2onnx.hub.vision_language.architecture import Prompt, VisionLanguageArchitecture, transformers_js_only
from fx2onnx.hub.vision_language.parts import Holder


def flagged(rows: torch.Tensor, flag: float) -> torch.Tensor:
    """``rows`` with one column of ``flag`` after the last."""
    return torch.cat([rows, rows.new_full((*rows.shape[:-1], 1), flag)], dim=-1)


class FlaggedVision(gemma3.GemmaVision):
    """Each image's features, a column of ones after them (image rows)."""

    def forward(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"image_features": flagged(super().forward(pixel_values)["image_features"], 1.0)}


class FlaggedTokenEmbedding(torch.nn.Module):
    """The token embedding, a column of zeros after it (text rows)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        embed_tokens = model.model.language_model.embed_tokens
        self.model = Holder(language_model=Holder(embed_tokens=embed_tokens))
        self.vocab = int(embed_tokens.num_embeddings)

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        ids = torch.where(input_ids < self.vocab, input_ids, torch.zeros_like(input_ids))
        return {"inputs_embeds": flagged(self.model.language_model.embed_tokens(ids), 0.0)}


class FlaggedGemmaDecoder(gemma3.GemmaDecoder):
    """gemma3.GemmaDecoder whose image tokens are the rows flagged in their last column."""

    def forward(self, inputs_embeds, attention_mask, position_ids, past_key_values) -> dict[str, Any]:
        return self.step(inputs_embeds[..., -1] > 0.5, inputs_embeds[..., :-1], attention_mask, position_ids, past_key_values)


def processor_size(image_processor: Any) -> tuple[int, int]:
    """The (height, width) the image processor resizes every image to (its pan-and-scan crops
    too: Transformers.js feeds the vision model what it is given)."""
    return int(image_processor.size["height"]), int(image_processor.size["width"])


def export_parts(loaded: LoadedModel, options: fx2onnx.ExportOptions, image_processor: Any,
                 architecture: VisionLanguageArchitecture) -> dict[str, fx2onnx.ONNXProgram]:
    """The three flagged parts: vision for the processor's one size, embedding, decoder with the
    model's own masks (every step: the fused text steps of ONNX Runtime GenAI's folder read `input_ids`)."""
    model = loaded.model
    plain = parts.without_causal_mask(options)
    vision = parts.as_loaded(gemma3.vision_inputs(loaded, processor_size(image_processor)), loaded, static=True)
    vision_options = dataclasses.replace(plain, dynamic_shapes=gemma3.vision_dynamic_shapes())
    inputs = gemma3.decoder_inputs(loaded, lambda value: parts.as_loaded(value, loaded), flagged=True)
    decoder_options = dataclasses.replace(plain, dynamic_shapes=parts.decoder_dynamic_shapes(inputs))
    vocab = int(loaded.config.text_config.vocab_size)
    ids = parts.as_loaded(torch.randint(0, vocab, (2, 9), generator=torch.Generator().manual_seed(0)), loaded)
    return {
        "vision": fx2onnx.dynamo_export(FlaggedVision(model), **vision, export_options=vision_options),
        "embedding": fx2onnx.dynamo_export(FlaggedTokenEmbedding(model), input_ids=ids, export_options=plain),
        "decoder": fx2onnx.dynamo_export(FlaggedGemmaDecoder(model), **inputs, export_options=decoder_options),
    }


def verification_sizes(model: torch.nn.Module, image_processor: Any) -> tuple[tuple[int, int], ...]:
    """One image of the processor's size (the prompt holds one image's tokens)."""
    return (processor_size(image_processor),)


def verification_prompt(model: torch.nn.Module, images: dict[str, torch.Tensor]) -> Prompt:
    """gemma3.py's prompt (transformers given `token_type_ids`), its features as flagged rows."""
    prompt = gemma3.verification_prompt(model, images)
    return dataclasses.replace(prompt, features=flagged(prompt.features.reshape(-1, prompt.features.shape[-1]), 1.0))


def image_features(vision: Any, images: dict[str, torch.Tensor]) -> np.ndarray:
    """The vision model on every image at once, as rows (Transformers.js's view)."""
    features = run_session(vision, {"pixel_values": images["pixel_values"].numpy()})["image_features"]
    return features.reshape(-1, features.shape[-1])


ARCHITECTURE = transformers_js_only(
    "Gemma 3 (Transformers.js's flagged rows)", export_parts=export_parts, verification_sizes=verification_sizes,
    verification_prompt=verification_prompt, image_features=image_features, mrope=False,
)
