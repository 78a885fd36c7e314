"""Gemma 3's vision and decoder models as ONNX Runtime GenAI's `gemma3` type runs them
(the embedding model is vision_language.Embedding, as for every VLM here).

- vision (`pixel_values` [images, channels, height, width] -> `image_features` [images,
  mm_tokens_per_image, hidden]): the SigLIP tower and the pooling projector, for the one
  size Gemma 3's image processor resizes every image to. The features keep a dim per
  image: the runtime sizes a 3-D output by the images and the tokens its processor gives
  per image (a 2-D one by the tokens alone, too short for two images).
- decoder (`input_ids`, `inputs_embeds`, `attention_mask`, `position_ids`, the cache ->
  `logits`, `present.*`): transformers lets an image's tokens attend each other both
  ways in the prefill (its `token_type_ids`), which the runtime does not hand the decoder;
  it does hand a decoder that declares `input_ids` the step's token ids (as for Gemma 4),
  so the decoder finds the image tokens itself and builds transformers' own masks from
  them. A decode step's ids are text: the mask is then transformers' causal one.
- sliding-window layers: the cache is captured as one that grows with the sequence in
  every layer and the window is a part of the mask, so a layer sees the tokens
  transformers' sliding cache keeps (the cache holds more than the window: memory, not
  numbers).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.export import Dim

from fx2onnx.hub import causal_lm
from fx2onnx.hub.loading import LoadedModel


# the image tokens the runtime's gemma3 processor puts per image (a constant of its
# src/models/gemma_image_processor.cpp, 0.18), so the only count a folder can have
RUNTIME_IMAGE_TOKENS = 256


def check_image_tokens(config: Any) -> None:
    tokens = int(config.mm_tokens_per_image)
    if tokens != RUNTIME_IMAGE_TOKENS:
        raise NotImplementedError(
            f"The model puts {tokens} tokens per image (mm_tokens_per_image); ONNX Runtime GenAI's gemma3 processor "
            f"always puts {RUNTIME_IMAGE_TOKENS}, so the folder could not run. Nothing was written."
        )


class Holder(torch.nn.Module):
    """A container that gives the modules it holds their checkpoint paths (the wrappers here and in vision_language.py)."""

    def __init__(self, **modules: torch.nn.Module) -> None:
        super().__init__()
        for name, module in modules.items():
            self.add_module(name, module)


class GemmaVision(torch.nn.Module):
    """The vision tower and projector: each image's `mm_tokens_per_image` features."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = Holder(vision_tower=model.model.vision_tower, multi_modal_projector=model.model.multi_modal_projector)

    def forward(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.model.vision_tower(pixel_values=pixel_values).last_hidden_state
        return {"image_features": self.model.multi_modal_projector(hidden)}


class LanguageModelWithHead(torch.nn.Module):
    """An image-text-to-text model's language model and LM head under their checkpoint
    paths: the base of the decoders (here and in vision_language.py)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        language_model = model.model.language_model
        self.model = Holder(language_model=language_model)
        self.lm_head = model.lm_head
        self.cache_argument = causal_lm.cache_argument(language_model)

    def logits_and_cache(self, output: Any) -> dict[str, Any]:
        return {"logits": self.lm_head(output.last_hidden_state), "present": causal_lm.output_cache(output)}


class GemmaDecoder(LanguageModelWithHead):
    """The language model and its head, image tokens of the step attending each other both ways."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self.image_token_id = int(model.config.image_token_id)
        self.text_config = model.config.get_text_config()

    def forward(self, input_ids, inputs_embeds, attention_mask, position_ids, past_key_values) -> dict[str, Any]:
        from transformers.models.gemma3.modeling_gemma3 import create_masks_for_vision_model, get_block_sequence_ids_for_mask

        blocks = get_block_sequence_ids_for_mask((input_ids == self.image_token_id).long(), device=input_ids.device)
        # transformers reads the blocks by absolute position: the cached tokens are text here (-1)
        cached = attention_mask.shape[1] - input_ids.shape[1]
        blocks = torch.cat([blocks.new_full((blocks.shape[0], cached), -1), blocks], dim=1)
        masks = create_masks_for_vision_model(
            config=self.text_config, inputs_embeds=inputs_embeds, attention_mask=attention_mask, cache=past_key_values,
            position_ids=position_ids, block_sequence_ids=blocks,
        )
        output = self.model.language_model(
            inputs_embeds=inputs_embeds, attention_mask=masks, position_ids=position_ids, use_cache=True,
            **{self.cache_argument: past_key_values},
        )
        return self.logits_and_cache(output)


def image_size(image_processor: Any) -> tuple[int, int]:
    """The (height, width) Gemma 3's image processor resizes every image to; pan and scan
    (crops added per image) is a step the runtime's processor does not take."""
    if getattr(image_processor, "do_pan_and_scan", False):
        raise NotImplementedError(
            "The image processor crops images (do_pan_and_scan), which ONNX Runtime GenAI's gemma3 processor does not: "
            "set do_pan_and_scan to false in preprocessor_config.json to export this folder."
        )
    size = image_processor.size
    return int(size["height"]), int(size["width"])


def vision_inputs(loaded: LoadedModel, size: tuple[int, int]) -> dict[str, torch.Tensor]:
    channels = int(getattr(loaded.config.vision_config, "num_channels", 3))
    return {"pixel_values": torch.randn(1, channels, *size, generator=torch.Generator().manual_seed(0))}


def vision_dynamic_shapes() -> dict[str, Any]:
    return {"pixel_values": {0: Dim.AUTO}}


def decoder_inputs(loaded: LoadedModel, fake: Any) -> dict[str, Any]:
    """A decode step after a prefill (sizes as causal_lm's) whose new tokens hold two
    image tokens, so the capture sees the image blocks; ``fake`` makes tensors fake when
    the model is. The prefill's cache grows in every layer (no sliding layers)."""
    from transformers import DynamicCache

    language_model = loaded.model.model.language_model
    batch, cached, new = causal_lm.BATCH, causal_lm.CACHED_TOKENS, causal_lm.NEW_TOKENS
    config = loaded.config
    vocab = int(config.text_config.vocab_size)
    ids = torch.randint(0, vocab, (batch, cached + new), generator=torch.Generator().manual_seed(0))
    ids[ids == config.image_token_id] = 0
    ids[:, cached:] = config.image_token_id
    hidden = int(config.text_config.hidden_size)
    embeds = torch.randn(batch, cached + new, hidden, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(batch, cached + new, dtype=torch.int64)
    positions = torch.arange(cached + new).view(1, -1).expand(batch, -1).contiguous()
    ids, embeds, mask, positions = fake((ids, embeds, mask, positions))
    mode = loaded.fake_context.fake_mode if loaded.fake_context is not None else contextlib.nullcontext()
    with mode, torch.no_grad():
        prefill = language_model(
            inputs_embeds=embeds[:, :cached], attention_mask=mask[:, :cached], position_ids=positions[:, :cached],
            use_cache=True, **{causal_lm.cache_argument(language_model): DynamicCache()},
        )
    cache = causal_lm.output_cache(prefill)
    return {"input_ids": ids[:, cached:], "inputs_embeds": embeds[:, cached:], "attention_mask": mask,
            "position_ids": positions[:, cached:].contiguous(), "past_key_values": cache}
