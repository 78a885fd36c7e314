"""PaliGemma as Transformers.js runs it (ONNX Runtime GenAI has no type for it).

transformers' PaliGemma attends both ways over the prefix (the images and the prompt: its
processor's `token_type_ids` are 0 there) in the first step of `generate` and causally after
(`PaliGemmaModel.forward`: block ids only when `is_first_iteration`). Transformers.js's
PaliGemmaForConditionalGeneration (its LlavaForConditionalGeneration) feeds the decoder
`inputs_embeds`, `attention_mask`, `position_ids` and the cache, and runs the whole prompt in
the first step, without a past: so the decoder takes a step without a past for the prefix
(all its tokens one block attending both ways, padding masked) and any other step causally.
Positions from 1, as both transformers and Transformers.js (`create_position_ids`' start
index for paligemma) give them.

- vision (`pixel_values` [images, 3, size, size] -> `image_features` [images, tokens,
  hidden]): the SigLIP tower and the projector, for the tower's one size (exported as LLaVA's);
- embed_tokens: the token embedding alone (parts.TokenEmbedding);
- decoder (`PrefixDecoder`): the language model and its head with the masks above.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

import fx2onnx
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.shared.verification import run_session
from fx2onnx.hub.vision_language import llava, parts
from fx2onnx.hub.vision_language.architecture import Prompt, VisionLanguageArchitecture, prompt_text, transformers_js_only
from fx2onnx.hub.vision_language.parts import Holder, LanguageModelWithHead


class PaliGemmaVision(torch.nn.Module):
    """The vision tower and projector for a batch of images of the tower's size."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = Holder(vision_tower=model.model.vision_tower, multi_modal_projector=model.model.multi_modal_projector)

    def forward(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.model.vision_tower(pixel_values).last_hidden_state
        return {"image_features": self.model.multi_modal_projector(hidden)}


class PrefixDecoder(LanguageModelWithHead):
    """The language model and its head: a step without a past (the prompt) one block attending
    both ways, any other step causal; sliding-window layers (PaliGemma 2's) the window as well."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self.text_config = model.config.get_text_config()
        # PaliGemma 2's (Gemma 2's) final soft cap, which PaliGemmaForConditionalGeneration applies to the head's logits
        self.cap = getattr(self.text_config, "final_logit_softcapping", None)

    def logits_and_cache(self, output: Any) -> dict[str, Any]:
        result = super().logits_and_cache(output)
        if self.cap is not None:
            result["logits"] = torch.tanh(result["logits"] / self.cap) * self.cap
        return result

    def forward(self, inputs_embeds, attention_mask, position_ids, past_key_values) -> dict[str, Any]:
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        batch, new = inputs_embeds.shape[:2]
        held = attention_mask.shape[1] - new
        # the step's tokens are the prefix when nothing is held (a tensor, so that both cases stay in the graph)
        is_prefix = attention_mask.new_ones(attention_mask.shape[1]).sum() == new
        step_blocks = torch.where(is_prefix, 0, -1).expand(batch, new)
        # transformers reads the blocks by absolute position: the held tokens are in none (-1)
        blocks = torch.cat([step_blocks.new_full((batch, held), -1), step_blocks], dim=1)
        arguments = dict(config=self.text_config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                         cache=past_key_values, position_ids=position_ids, block_sequence_ids=blocks)
        masks = create_causal_mask(**arguments)
        if getattr(self.text_config, "sliding_window", None) is not None:
            masks = {"full_attention": masks, "sliding_attention": create_sliding_window_causal_mask(**arguments)}
        output = self.model.language_model(
            inputs_embeds=inputs_embeds, attention_mask=masks, position_ids=position_ids, use_cache=True,
            **{self.cache_argument: past_key_values},
        )
        return self.logits_and_cache(output)


def export_parts(loaded: LoadedModel, options: fx2onnx.ExportOptions, image_processor: Any,
                 architecture: VisionLanguageArchitecture) -> dict[str, fx2onnx.ONNXProgram]:
    """The vision model for any number of images of the tower's size (LLaVA's), the token embedding, the decoder."""
    inputs = parts.decoder_inputs(loaded, architecture)
    # the prefix attends both ways: the model's own masks, not the causal kernel's
    decoder_options = dataclasses.replace(parts.without_causal_mask(options), dynamic_shapes=parts.decoder_dynamic_shapes(inputs))
    return {
        "vision": llava.export_vision(PaliGemmaVision(loaded.model), loaded, options),
        "embedding": parts.export_token_embedding(loaded, options),
        "decoder": fx2onnx.dynamo_export(PrefixDecoder(loaded.model), **inputs, export_options=decoder_options),
    }


def verification_prompt(model: torch.nn.Module, images: dict[str, torch.Tensor]) -> Prompt:
    """The images' tokens, then the prompt's text, as PaliGemmaProcessor lays them out; transformers
    given `token_type_ids` of the prefix (0), positions from 1 as both give them."""
    config = model.config
    text = prompt_text(config, {int(config.image_token_id)})
    features = model.model.get_image_features(images["pixel_values"]).pooler_output
    ids = torch.tensor([[int(config.image_token_id)] * (features.shape[0] * features.shape[1]) + text[:8]])
    return Prompt(ids, {"pixel_values": images["pixel_values"], "token_type_ids": torch.zeros_like(ids)},
                  features.reshape(-1, features.shape[-1]), np.arange(1, ids.shape[1] + 1, dtype=np.int64)[None],
                  lambda index: np.array([[index + 1]], dtype=np.int64))


def image_features(vision: Any, images: dict[str, torch.Tensor]) -> np.ndarray:
    """The vision model on the images in one run, as rows (Transformers.js's view)."""
    features = run_session(vision, {"pixel_values": images["pixel_values"].numpy()})["image_features"]
    return features.reshape(-1, features.shape[-1])


# two images of other sizes than the tower's, as LLaVA's verification
ARCHITECTURE = transformers_js_only(
    "PaliGemma", export_parts=export_parts, verification_sizes=llava.verification_sizes, verification_prompt=verification_prompt,
    image_features=image_features, mrope=False,
)
