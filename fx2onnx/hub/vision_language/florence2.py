"""Florence-2 as Transformers.js runs it (its Florence2ForConditionalGeneration, an
encoder-decoder of the ImageTextToText kind): four models under `onnx/`.

- `vision_encoder`: `pixel_values` [images, 3, height, width] -> `image_features`
  [images, tokens, width], the DaViT tower and its projector (transformers' `get_image_features`).
- `embed_tokens`: `input_ids` -> `inputs_embeds`, the shared (scaled) token embedding; Transformers.js
  embeds both the prompt and each decoder step with it.
- `encoder_model`: `inputs_embeds`, `attention_mask` -> `last_hidden_state`, BART's encoder.
  Transformers.js puts the image features before the prompt's embeddings and ones before
  its mask; transformers' processor writes as many image tokens before the prompt, whose
  rows it replaces by the features: the same rows.
- `decoder_model_merged`: `inputs_embeds` (a step's embedded ids), `encoder_hidden_states`,
  `encoder_attention_mask`, `past_key_values.{i}.decoder/encoder.key/.value` and
  `use_cache_branch` -> `logits`, `present.*`: the first step and the next ones captured
  apart and merged (shared/merged_decoder.py), as the sequence-to-sequence folders' decoder.

Each part holds the whole model (as `model`), so its weights keep the checkpoint's names.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.export import Dim

import fx2onnx
from fx2onnx.hub.decoders.decode_step import cache_argument, output_cache
from fx2onnx.hub.loading import LoadedModel, eager_forwards
from fx2onnx.hub.shared import folder_layout
from fx2onnx.hub.shared.merged_decoder import merge_decoders
from fx2onnx.hub.shared.program_files import exported, fake_inputs, onnx_file, save_program
from fx2onnx.hub.shared.renamed_weights import part_checkpoint
from fx2onnx.hub.vision_language import genai_files, parts

VISION, EMBEDDING, DECODER = genai_files.VISION, genai_files.EMBEDDING, genai_files.DECODER
ENCODER = folder_layout.ENCODER
FILES = (VISION, EMBEDDING, ENCODER, DECODER)  # the models Transformers.js loads, by file name
# example sizes no other dim shares: images, prompt tokens, decoded and new decoder tokens
IMAGES, PROMPT, DECODED, NEW_TOKENS = 2, 5, 4, 3


class VisionEncoder(nn.Module):
    """The vision tower and projector: each image's feature rows."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"image_features": self.model.get_image_features(pixel_values).pooler_output}


class TokenEmbedding(nn.Module):
    """The shared token embedding (BART's, scaled where the text config says)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"inputs_embeds": self.model.get_input_embeddings()(input_ids)}


class Encoder(nn.Module):
    """BART's encoder over embedded rows (the image features, then the prompt's tokens)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        encoder = self.model.model.language_model.encoder
        return {"last_hidden_state": encoder(inputs_embeds=inputs_embeds, attention_mask=attention_mask).last_hidden_state}


class DecoderStep(nn.Module):
    """A decode step over embedded ids with Optimum's names. BART's decoder and the LM head
    are called themselves: Florence2Model.forward reads the prompt's embeddings to size a
    decoder start it makes when given none, and has none when given the encoder's output."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.cache_argument = cache_argument(model.model.language_model.decoder)

    def forward(self, inputs_embeds: torch.Tensor, encoder_hidden_states: torch.Tensor, encoder_attention_mask: torch.Tensor,
                cache: Any = None) -> dict[str, Any]:
        outputs = self.model.model.language_model.decoder(
            inputs_embeds=inputs_embeds, encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask, use_cache=True, **{self.cache_argument: cache},
        )
        return {"logits": self.model.lm_head(outputs.last_hidden_state), "present": output_cache(outputs)}


def image_side(image_processor: Any) -> tuple[int, int]:
    """The (height, width) the image processor resizes every image to; a NotImplementedError
    for a processor that gives images of other sizes (the vision model takes one)."""
    size, crop = image_processor.size, getattr(image_processor, "do_center_crop", False)
    if "height" not in size or "width" not in size or crop:
        raise NotImplementedError(
            f"the image processor's size is {dict(size)} (do_center_crop {crop}), not one height and width: the "
            "Florence-2 folder's vision model takes the one size Florence-2's processors resize every image to. Nothing "
            "was written. Give the image processor a `size` of height and width and do_center_crop false, as released "
            "Florence-2 checkpoints have."
        )
    return int(size["height"]), int(size["width"])


def example_inputs(loaded: LoadedModel, image_processor: Any) -> dict[str, torch.Tensor]:
    """Real example inputs: IMAGES images of the processor's size and a prompt of PROMPT tokens each."""
    height, width = image_side(image_processor)
    generator = torch.Generator().manual_seed(0)
    vocab = int(loaded.config.text_config.vocab_size)
    return {"pixel_values": torch.randn(IMAGES, 3, height, width, generator=generator),
            "input_ids": torch.randint(3, vocab, (IMAGES, PROMPT), generator=generator),
            "decoder_input_ids": torch.randint(3, vocab, (IMAGES, DECODED + NEW_TOKENS), generator=generator)}


def _encoder_inputs(loaded: LoadedModel, examples: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The encoder's inputs as Transformers.js makes them (fake when the model is): each image's
    features then its prompt's embeddings, and ones over both."""
    with eager_forwards(loaded), torch.no_grad():
        features = VisionEncoder(loaded.model)(examples["pixel_values"].clone())["image_features"]
        embeds = TokenEmbedding(loaded.model)(examples["input_ids"].clone())["inputs_embeds"]
        rows = torch.cat([features, embeds], dim=1)
        return {"inputs_embeds": rows, "attention_mask": torch.ones(rows.shape[:2], dtype=torch.int64)}


def _decoder_inputs(loaded: LoadedModel, examples: dict[str, torch.Tensor], with_past: bool) -> dict[str, Any]:
    """A decode step's inputs (fake when the model is): the first step, or one after DECODED tokens."""
    model = loaded.model
    encoder = _encoder_inputs(loaded, examples)
    with eager_forwards(loaded), torch.no_grad():
        hidden = Encoder(model)(**encoder)["last_hidden_state"]
        embed, step = TokenEmbedding(model), DecoderStep(model)
        ids = examples["decoder_input_ids"].clone()
        inputs: dict[str, Any] = {"encoder_hidden_states": hidden, "encoder_attention_mask": encoder["attention_mask"]}
        if with_past:
            inputs["cache"] = step(embed(ids[:, :DECODED])["inputs_embeds"], hidden, encoder["attention_mask"])["present"]
            ids = ids[:, DECODED:]
        inputs["inputs_embeds"] = embed(ids)["inputs_embeds"]
    return inputs


def export_folder(loaded: LoadedModel, staging: Path, options: fx2onnx.ExportOptions, image_processor: Any) -> list[str]:
    """Write the four models into ``staging``; their paths."""
    model = loaded.model
    examples = example_inputs(loaded, image_processor)
    # every part holds the whole model as `model`: the checkpoint by the names of any of them
    checkpoint = part_checkpoint(loaded.folder, model, Encoder(model)) if loaded.fake_context is not None else None

    def save(program: fx2onnx.ONNXProgram, folder: Path, relative: str) -> list[str]:
        state = None
        if checkpoint is not None:  # the part's own weights and their tied names (the LM head of the embedding)
            signature = program.model_signature
            state = checkpoint.only(set(signature.torch_names().values()) | {n for names in signature.aliases().values() for n in names})
        return save_program(program, folder, relative, loaded, state)

    plain = parts.without_causal_mask(options)
    # images of the processor's one size, any number of them
    vision_options = dataclasses.replace(plain, dynamic_shapes={"pixel_values": {0: Dim.AUTO}})
    files = save(fx2onnx.dynamo_export(VisionEncoder(model).eval(), **fake_inputs({"pixel_values": examples["pixel_values"]}, loaded),
                                       export_options=vision_options), staging, onnx_file(loaded, VISION))
    files += save(exported(TokenEmbedding(model).eval(), fake_inputs({"input_ids": examples["input_ids"]}, loaded), plain),
                  staging, onnx_file(loaded, EMBEDDING))
    files += save(exported(Encoder(model).eval(), _encoder_inputs(loaded, examples), options), staging, onnx_file(loaded, ENCODER))
    steps = staging / ".decoder_steps"
    paths = []
    for name, with_past in (("decoder_model.onnx", False), ("decoder_with_past_model.onnx", True)):
        program = exported(DecoderStep(model).eval(), _decoder_inputs(loaded, examples, with_past), options)
        save(program, steps, name)
        paths.append(steps / name)
    merged = onnx_file(loaded, DECODER)
    merge_decoders(*paths, staging / merged, folder_layout.data_file(merged))
    shutil.rmtree(steps)
    return files + folder_layout.with_data_file(merged)
