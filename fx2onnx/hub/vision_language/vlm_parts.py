"""Image-text-to-text models as ONNX Runtime GenAI runs them: three models cut from the
checkpoint's own modules (vlm_layout.py names the files and writes the configs).

- vision (`pixel_values` [patches, channels x temporal x patch x patch] and
  `image_grid_thw` [1, 3] -> `image_features` [image tokens, hidden]): Qwen2.5-VL's
  vision tower with its patch merger, for one image of any size (the runtime runs it once
  per image). transformers computes its window and rotary layouts from the grid with
  `.tolist()` loops; here they are computed in the graph from the grid's numbers and the
  patch count (vision_grid.py). The runtime's processor resizes each image as
  transformers' does (`vlm_layout.qwen_processor_config`).
- embedding (`input_ids`, `image_features` -> `inputs_embeds`): the token embedding, with
  each image token's row replaced by the next image feature, as the model's forward does.
- decoder (`inputs_embeds`, `attention_mask`, 3-D mRoPE `position_ids` [3, batch,
  tokens], the cache -> `logits`, `present.*`): the language model and its head, captured
  as a decode step after a prefill like a causal LM (decode_step.py), with the same fused
  kernels (GroupQueryAttention where the runtime's kernel applies).

Qwen3-VL (vlm_qwen3.py) takes these paths with its own vision tower, its DeepStack
features carried in wider `image_features` and `inputs_embeds` rows. Gemma 3 (vlm_gemma3.py) shares the embedding model; its vision model takes whole images
and its decoder takes `input_ids` too, for the image tokens' two-way attention.

The wrappers hold the checkpoint's submodules under the checkpoint's own paths
(`model.language_model.*`, `lm_head.*`), so a fake-mode export finds each weight in the
folder by its name.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import Dim

import fx2onnx
from fx2onnx.capture import registered_containers
from fx2onnx.hub.decoders import decode_step
from fx2onnx.hub.decoders import text_only
from fx2onnx.hub.vision_language import vision_grid
from fx2onnx.hub.vision_language import vlm_gemma3
from fx2onnx.hub.vision_language import vlm_mistral3
from fx2onnx.hub.vision_language import vlm_qwen3
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.vision_language.vlm_gemma3 import Holder, LanguageModelWithHead

# the model types export-hf writes image-text-to-text folders for, with ONNX Runtime GenAI's type
GENAI_VLM_TYPES = {"qwen2_5_vl": "qwen2_5_vl", "qwen3_vl": "qwen3_vl", "gemma3": "gemma3", "mistral3": vlm_mistral3.GENAI_TYPE}
# the packed (block-diagonal) attention of the vision tower, registered with transformers
# under a name with "flash" in it: transformers then hands it the segment bounds as a
# tensor instead of splitting the sequence with `.tolist()` (a data-dependent split)
PACKED_ATTENTION = "fx2onnx_flash_packed_vision"


def check_supported(config: Any) -> None:
    """A clear error, before anything is written, for a model type without a runtime layout here."""
    model_type = getattr(config, "model_type", None)
    if model_type == "gemma3":
        try:
            vlm_gemma3.check_image_tokens(config)
        except NotImplementedError as error:  # the same refusal, naming what works
            raise NotImplementedError(f"{error} {text_only.command_hint(config)}") from error
    if model_type not in GENAI_VLM_TYPES:
        raise NotImplementedError(
            f"export-hf writes image-text-to-text folders (ONNX Runtime GenAI's vision, embedding and decoder models) "
            f"for model types {', '.join(GENAI_VLM_TYPES)}; {model_type} is not one of them. Nothing was written. "
            f"{text_only.command_hint(config)}"
        )


def _packed_attention(module, query, key, value, attention_mask=None, scaling=None, cu_seq_lens_q=None, **kwargs):
    """Attention within each segment that ``cu_seq_lens_q`` bounds, as one masked attention."""
    positions = torch.arange(query.shape[2], device=query.device, dtype=cu_seq_lens_q.dtype)
    segment = (positions[:, None] >= cu_seq_lens_q[None, 1:]).sum(-1)
    mask = segment[:, None] == segment[None, :]
    output = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return output.transpose(1, 2).contiguous(), None


def _packed_vision_attention(config: Any) -> contextlib.AbstractContextManager[None]:
    return vlm_gemma3.attention_implementation(config, PACKED_ATTENTION, _packed_attention)


class QwenVision(torch.nn.Module):
    """Qwen2.5-VL's vision tower for one image of any size: its window and rotary layouts
    computed in the graph from ``image_grid_thw`` ([1, 3]) and the patch count (vision_grid.py)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        visual = model.model.visual
        self.model = Holder(visual=visual)
        config = visual.config
        self.merge = int(config.spatial_merge_size)
        self.window = int(config.window_size) // self.merge // int(config.patch_size)

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> dict[str, torch.Tensor]:
        patches = torch.arange(pixel_values.shape[0], device=pixel_values.device)
        window_index, cu_window_seqlens = vision_grid.window_layout(image_grid_thw, patches, self.merge, self.window)
        output = self.model.visual(
            pixel_values, image_grid_thw, position_ids=vision_grid.position_ids(image_grid_thw, patches, self.merge),
            cu_seqlens=vision_grid.frame_bounds(image_grid_thw, patches), window_index=window_index,
            cu_window_seqlens=cu_window_seqlens, max_seqlen=0, max_window_seqlen=0,
        )
        return {"image_features": output.pooler_output}


class Embedding(torch.nn.Module):
    """Token embeddings with the image tokens' rows taken from ``image_features`` in order."""

    def __init__(self, model: torch.nn.Module, image_token_id: int) -> None:
        super().__init__()
        self.model = Holder(language_model=Holder(embed_tokens=model.model.language_model.embed_tokens))
        self.image_token_id = image_token_id
        # columns after the embedding: Qwen3-VL's DeepStack features (vlm_qwen3.py), zeros at text tokens
        self.extra = vlm_qwen3.row_width(model.config) - int(model.config.text_config.hidden_size)

    def forward(self, input_ids: torch.Tensor, image_features: torch.Tensor) -> dict[str, torch.Tensor]:
        embeds = self.model.language_model.embed_tokens(input_ids)
        if self.extra:
            embeds = torch.cat([embeds, embeds.new_zeros(*embeds.shape[:-1], self.extra)], dim=-1)
        is_image = input_ids == self.image_token_id
        if image_features.dim() == 3:  # [images, tokens per image, hidden] (Gemma 3's): the images' rows in order
            image_features = image_features.reshape(-1, image_features.shape[-1])
        # the k-th image token (counted across the batch) takes feature row k; a decode
        # step has no features and keeps the token's own embedding, as transformers does
        # for an image token it generates; an appended zero row keeps the gather in bounds
        count = image_features.shape[0]
        rows = torch.cat([image_features.to(embeds.dtype), embeds.new_zeros(1, embeds.shape[-1])])
        flat = is_image.reshape(-1)
        index = (torch.cumsum(flat.to(torch.int64), dim=0) - 1).reshape(is_image.shape)
        takes = is_image & (index < count)
        index = torch.where(takes, index, count)
        return {"inputs_embeds": torch.where(takes[..., None], rows[index], embeds)}


class Decoder(LanguageModelWithHead):
    """The language model and its head over ``inputs_embeds`` and the cache."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self.deepstack = vlm_qwen3.deepstack_layers(model.config)
        self.hidden = int(model.config.text_config.hidden_size)

    def forward(self, inputs_embeds, attention_mask, position_ids, past_key_values) -> dict[str, Any]:
        language_model, extra = self.model.language_model, {}
        if self.deepstack:  # Qwen3-VL: rows wider than the embeddings (vlm_qwen3.py)
            inputs_embeds, extra = vlm_qwen3.deepstack_arguments(language_model, inputs_embeds, self.hidden)
        try:
            output = language_model(
                inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
                **{self.cache_argument: past_key_values}, **extra,
            )
        finally:
            vlm_qwen3.restore_deepstack(language_model)
        return self.logits_and_cache(output)


def _as_loaded(value: Any, loaded: LoadedModel, static: bool = False) -> Any:
    """``value``'s tensors made fake when the model is (a fake-mode export), else as they
    are; ``static``: with their sizes as numbers (Gemma 3's vision model's one image size)."""
    if loaded.fake_context is None:
        return value
    mode = loaded.fake_context.fake_mode
    return pytree.tree_map_only(torch.Tensor, lambda tensor: mode.from_tensor(tensor, static_shapes=static), value)


def example_grid(loaded: LoadedModel) -> torch.Tensor:
    """The patch grid ([[1, h, w]]) of the vision model's example: 3 x 5 merged tokens, a
    grid that is not square and that Qwen2.5-VL's windows do not tile."""
    merge = int(loaded.config.vision_config.spatial_merge_size)
    return torch.tensor([[1, 3 * merge, 5 * merge]], dtype=torch.int64)


def vision_inputs(loaded: LoadedModel, grid: torch.Tensor) -> dict[str, torch.Tensor]:
    vision = loaded.config.vision_config
    patches = int(grid.prod())
    width = int(vision.in_channels) * int(vision.temporal_patch_size) * int(vision.patch_size) ** 2
    pixels = torch.randn(patches, width, generator=torch.Generator().manual_seed(0))
    return _as_loaded({"pixel_values": pixels, "image_grid_thw": grid}, loaded)


def embedding_inputs(loaded: LoadedModel, per_image: bool = False) -> dict[str, torch.Tensor]:
    """Two sequences with 5 image tokens; ``per_image``: the features as the vision model
    gives them per image ([images, tokens, hidden], here one image of 5 tokens)."""
    config = loaded.config
    vocab = int(config.text_config.vocab_size)
    ids = torch.randint(0, vocab, (2, 9), generator=torch.Generator().manual_seed(0))
    ids[ids == config.image_token_id] = 0
    ids[0, 2:5] = config.image_token_id  # 3 image tokens in one sequence, 2 in the other
    ids[1, 4:6] = config.image_token_id
    features = torch.randn(5, vlm_qwen3.row_width(config), generator=torch.Generator().manual_seed(1))
    if per_image:
        features = features[None]
    return _as_loaded({"input_ids": ids, "image_features": features}, loaded)


def decoder_inputs(loaded: LoadedModel) -> dict[str, Any]:
    """A decode step after a prefill (sizes as causal_lm's), with text positions on all 3
    mRoPE axes (Mistral 3's: 1-D positions, [batch, tokens])."""
    language_model = loaded.model.model.language_model
    batch, cached, new = decode_step.BATCH, decode_step.CACHED_TOKENS, decode_step.NEW_TOKENS
    hidden = int(loaded.config.text_config.hidden_size)
    embeds = torch.randn(batch, cached + new, hidden, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(batch, cached + new, dtype=torch.int64)
    positions = torch.arange(cached + new).view(1, 1, -1).expand(3, batch, -1).contiguous()
    if loaded.config.model_type == "mistral3":
        positions = positions[0]
    embeds, mask, positions = _as_loaded((embeds, mask, positions), loaded)
    mode = loaded.fake_context.fake_mode if loaded.fake_context is not None else contextlib.nullcontext()
    with mode, torch.no_grad():
        prefill = language_model(
            inputs_embeds=embeds[:, :cached], attention_mask=mask[:, :cached], position_ids=positions[..., :cached], use_cache=True
        )
    cache = decode_step.output_cache(prefill)
    step = embeds[:, cached:]
    if vlm_qwen3.deepstack_layers(loaded.config):  # Qwen3-VL's DeepStack columns (vlm_qwen3.py)
        width = vlm_qwen3.row_width(loaded.config) - hidden
        extra = torch.randn(batch, new, width, generator=torch.Generator().manual_seed(2))
        step = torch.cat([step, _as_loaded(extra, loaded)], dim=-1)
    return {"inputs_embeds": step, "attention_mask": mask, "position_ids": positions[..., cached:].contiguous(),
            "past_key_values": cache}


def _dynamic(value: Any, keep: dict[int, int] | None = None) -> Any:
    """Every dim of ``value``'s tensors dynamic but those of ``keep`` (torch.export's spec form)."""
    if isinstance(value, torch.Tensor):
        return {index: Dim.AUTO for index in range(value.dim()) if index not in (keep or {})}
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


def _export_gemma3_parts(loaded: LoadedModel, options: fx2onnx.ExportOptions, size: tuple[int, int]) -> dict[str, Any]:
    model = loaded.model
    plain = dataclasses.replace(options, causal_mask_input=None)
    vision_options = dataclasses.replace(plain, dynamic_shapes=vlm_gemma3.vision_dynamic_shapes())
    vision = _as_loaded(vlm_gemma3.vision_inputs(loaded, size), loaded, static=True)
    inputs = vlm_gemma3.decoder_inputs(loaded, lambda value: _as_loaded(value, loaded))
    # image blocks attend both ways: an explicit mask, not the causal kernel's
    decoder_options = dataclasses.replace(plain, dynamic_shapes=decoder_dynamic_shapes(inputs))
    decoder = fx2onnx.dynamo_export(vlm_gemma3.GemmaDecoder(model), **inputs, export_options=decoder_options)
    if options.runtime == "onnxruntime" and not vlm_gemma3.text_step_refusal(loaded.config):
        # text steps (every decode step) through onnxruntime's fused kernel, in one decoder with the above
        inputs = vlm_gemma3.decoder_inputs(loaded, lambda value: _as_loaded(value, loaded))
        text_step = fx2onnx.dynamo_export(vlm_gemma3.GemmaTextStep(model), **inputs, export_options=decoder_options)
        vlm_gemma3.decoder_with_fused_text_steps(decoder.model, text_step.model, int(loaded.config.image_token_id))
    return {
        "vision": fx2onnx.dynamo_export(vlm_gemma3.GemmaVision(model), **vision, export_options=vision_options),
        "embedding": fx2onnx.dynamo_export(
            Embedding(model, int(loaded.config.image_token_id)), **embedding_inputs(loaded, per_image=True), export_options=plain
        ),
        "decoder": decoder,
    }


def export_parts(loaded: LoadedModel, options: fx2onnx.ExportOptions, image_processor: Any) -> dict[str, fx2onnx.ONNXProgram]:
    """The vision, embedding and decoder exports (``image_processor``: the checkpoint's)."""
    config, model = loaded.config, loaded.model
    if config.model_type == "gemma3":
        return _export_gemma3_parts(loaded, options, vlm_gemma3.image_size(image_processor))
    programs = {}
    plain = dataclasses.replace(options, causal_mask_input=None)
    if config.model_type == "mistral3":  # one image [1, 3, height, width] of any size
        vlm_mistral3.check_image_processor(image_processor, config)
        vision_options = dataclasses.replace(plain, dynamic_shapes={"pixel_values": {2: Dim.AUTO, 3: Dim.AUTO}})
        pixels = _as_loaded(vlm_mistral3.example_pixels(config), loaded)
        programs["vision"] = fx2onnx.dynamo_export(
            vlm_mistral3.PixtralVision(model), pixel_values=pixels, export_options=vision_options
        )
        return _export_text_parts(loaded, options, programs)
    vision = (vlm_qwen3.Qwen3Vision if config.model_type == "qwen3_vl" else QwenVision)(model)
    # one image at a time (the runtime runs the model per image), of any number of patches
    vision_options = dataclasses.replace(plain, dynamic_shapes={"pixel_values": {0: Dim.AUTO}, "image_grid_thw": None})
    with _packed_vision_attention(model.model.visual.config):
        programs["vision"] = fx2onnx.dynamo_export(
            vision, **vision_inputs(loaded, example_grid(loaded)), export_options=vision_options
        )
    return _export_text_parts(loaded, options, programs)


def _export_text_parts(
    loaded: LoadedModel, options: fx2onnx.ExportOptions, programs: dict[str, fx2onnx.ONNXProgram]
) -> dict[str, fx2onnx.ONNXProgram]:
    """``programs`` with the embedding and the decoder over `inputs_embeds` added."""
    config, model = loaded.config, loaded.model
    plain = dataclasses.replace(options, causal_mask_input=None)
    programs["embedding"] = fx2onnx.dynamo_export(
        Embedding(model, int(config.image_token_id)), **embedding_inputs(loaded), export_options=plain
    )
    inputs = decoder_inputs(loaded)
    causal = decode_step.attends_causally(config.text_config)
    decoder_options = dataclasses.replace(
        options, dynamic_shapes=decoder_dynamic_shapes(inputs), causal_mask_input="attention_mask" if causal else None
    )
    programs["decoder"] = fx2onnx.dynamo_export(Decoder(model), **inputs, export_options=decoder_options)
    return programs
