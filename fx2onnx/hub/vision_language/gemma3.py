"""Gemma 3's vision and decoder models as ONNX Runtime GenAI's `gemma3` type runs them
(the embedding model is parts.Embedding, as for every architecture here).

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
- two decoders in one `If` (`decoder_with_fused_text_steps`): a step with image tokens
  takes the model's own masks above (`GemmaDecoder`); a step of text only, every decode
  step, takes onnxruntime's fused `GroupQueryAttention` (`GemmaTextStep`), its mask the
  kernel's causal one with the padding as the kernel's attention bias and, in
  sliding-window layers, the window as the kernel's own (`local_window_size`), so that an
  unpadded step past the window runs the kernel without a bias, rotating query and key
  itself (`onnx_passes/cached_attention_guard`; a row with padding after held tokens
  counts the window in held tokens there, as export-hf's text decoders). Both update a
  cache buffer the runtime shares between past and present in place.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir
import torch
from torch.export import Dim

import fx2onnx  # its fused kernels register torch.ops.fx2onnx.cached_attention
from fx2onnx.hub.decoders import decode_step
from fx2onnx.hub.loading import LoadedModel, eager_forwards
from fx2onnx.hub.shared.merged_decoder import models_in_if
from fx2onnx.hub.shared.verification import run_session
from fx2onnx.hub.vision_language import genai_files, parts
from fx2onnx.hub.vision_language.architecture import Prompt, VisionLanguageArchitecture, prompt_text
from fx2onnx.hub.vision_language.parts import Holder, LanguageModelWithHead, attention_implementation


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


class GemmaVision(torch.nn.Module):
    """The vision tower and projector: each image's `mm_tokens_per_image` features."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = Holder(vision_tower=model.model.vision_tower, multi_modal_projector=model.model.multi_modal_projector)

    def forward(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.model.vision_tower(pixel_values=pixel_values).last_hidden_state
        return {"image_features": self.model.multi_modal_projector(hidden)}


class GemmaDecoder(LanguageModelWithHead):
    """The language model and its head, image tokens of the step attending each other both ways."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self.image_token_id = int(model.config.image_token_id)
        self.text_config = model.config.get_text_config()

    def forward(self, input_ids, inputs_embeds, attention_mask, position_ids, past_key_values) -> dict[str, Any]:
        return self.step(input_ids == self.image_token_id, inputs_embeds, attention_mask, position_ids, past_key_values)

    def step(self, is_image: torch.Tensor, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor,
             position_ids: torch.Tensor, past_key_values: Any) -> dict[str, Any]:
        """The step whose ``is_image`` tokens (batch, tokens) attend each other both ways within each run of them."""
        from transformers.models.gemma3.modeling_gemma3 import create_masks_for_vision_model, get_block_sequence_ids_for_mask

        blocks = get_block_sequence_ids_for_mask(is_image.long(), device=is_image.device)
        # transformers reads the blocks by absolute position: the cached tokens are text here (-1)
        cached = attention_mask.shape[1] - is_image.shape[1]
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


def decoder_inputs(loaded: LoadedModel, fake: Any, flagged: bool = False) -> dict[str, Any]:
    """A decode step after a prefill (sizes as causal_lm's) whose new tokens hold two
    image tokens, so the capture sees the image blocks; ``fake`` makes tensors fake when
    the model is. The prefill's cache grows in every layer (no sliding layers). ``flagged``:
    no `input_ids`, the step's embeddings one column wider, 1 at the image tokens
    (gemma3_transformers_js.py)."""
    from transformers import DynamicCache

    language_model = loaded.model.model.language_model
    batch, cached, new = decode_step.BATCH, decode_step.CACHED_TOKENS, decode_step.NEW_TOKENS
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
    with eager_forwards(loaded), torch.no_grad():
        prefill = language_model(
            inputs_embeds=embeds[:, :cached], attention_mask=mask[:, :cached], position_ids=positions[:, :cached],
            use_cache=True, **{decode_step.cache_argument(language_model): DynamicCache()},
        )
    cache = decode_step.output_cache(prefill)
    step = {"input_ids": ids[:, cached:], "inputs_embeds": embeds[:, cached:], "attention_mask": mask,
            "position_ids": positions[:, cached:].contiguous(), "past_key_values": cache}
    if flagged:
        with eager_forwards(loaded):
            flags = (step.pop("input_ids") == config.image_token_id).to(embeds.dtype)[..., None]
            step["inputs_embeds"] = torch.cat([step["inputs_embeds"], flags], dim=-1)
    return step


# the name the text step's attention is registered under with transformers
CACHED_ATTENTION = "fx2onnx_gemma3_cached_attention"


@dataclass
class _Step:
    """What the text step's attention function reads and writes by layer: each layer's
    past key and value, the kernel's sequence lengths, and the present caches it returns."""

    pasts: list[tuple[torch.Tensor, torch.Tensor]]
    seqlens: torch.Tensor
    total: torch.Tensor
    presents: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


_STEPS: list[_Step] = []  # the step being traced (a stack: one at a time)


def _cached_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor, scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """A layer's attention as onnxruntime's GroupQueryAttention: the new tokens' query, key
    and value (B, heads, S, D) over the layer's past; ``attention_mask`` is the kernel's
    attention bias (B, 1, S, total), a sliding layer's window the kernel's own."""
    step = _STEPS[-1]
    past_key, past_value = step.pasts[module.layer_idx]
    heads, key_heads = query.shape[1], key.shape[1]
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    window = getattr(module, "sliding_window", None)
    output, present_key, present_value = torch.ops.fx2onnx.cached_attention(
        *(x.transpose(1, 2).flatten(2) for x in (query, key, value)), past_key, past_value, step.seqlens, step.total,
        attention_mask, scale, heads, key_heads, -1 if window is None else int(window),
    )
    step.presents[module.layer_idx] = (present_key, present_value)
    return output.unflatten(-1, (heads, -1)), None


def step_bias(attention_mask: torch.Tensor, new: int, dtype: torch.dtype) -> torch.Tensor:
    """The kernel's attention bias (B, 1, S, total) for ``new`` tokens last in
    ``attention_mask`` (B, total): 0 where a key is held, the dtype's lowest where it is
    padding. The kernel adds its causal mask and a sliding layer's window."""
    held = attention_mask.bool()[:, None, None, :]
    zero, lowest = torch.zeros((), dtype=dtype), torch.full((), torch.finfo(dtype).min, dtype=dtype)
    return torch.where(held, zero, lowest).expand(-1, -1, new, -1)


class GemmaTextStep(LanguageModelWithHead):
    """A step of text tokens (no image token): the language model and its head with each
    layer's attention through onnxruntime's GroupQueryAttention (``_cached_attention``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self.layer_types = set(model.config.get_text_config().layer_types)

    def forward(self, input_ids, inputs_embeds, attention_mask, position_ids, past_key_values) -> dict[str, Any]:
        from transformers import DynamicCache

        new = inputs_embeds.shape[1]
        total = torch.scalar_tensor(attention_mask.shape[1], dtype=torch.int32)
        seqlens = (total - 1).expand(attention_mask.shape[0])
        step = _Step([(layer.keys, layer.values) for layer in past_key_values.layers], seqlens, total)
        language_model = self.model.language_model
        _STEPS.append(step)
        try:
            with attention_implementation(language_model.config, CACHED_ATTENTION, _cached_attention):
                output = language_model(
                    inputs_embeds=inputs_embeds, position_ids=position_ids, use_cache=False,
                    attention_mask=dict.fromkeys(self.layer_types, step_bias(attention_mask, new, inputs_embeds.dtype)),
                )
        finally:
            _STEPS.pop()
        present = DynamicCache()
        for index in range(len(step.pasts)):
            present.update(*step.presents[index], index)
        return {"logits": self.lm_head(output.last_hidden_state), "present": present}


def text_step_refusal(config: Any) -> str:
    """Why the text step cannot take the fused kernel for this model ('' when it can)."""
    text_config = config.get_text_config()
    if getattr(text_config, "attn_logit_softcapping", None) is not None:
        return "its attention caps the logits (attn_logit_softcapping), which the kernel is not given"
    unknown = set(text_config.layer_types) - {"full_attention", "sliding_attention"}
    if unknown:
        return f"its layer types {sorted(unknown)} are neither full nor sliding-window attention"
    return ""


# the two branches' value prefixes in the decoder's `If`
IMAGE_STEP, TEXT_STEP = "image_step", "text_step"


def _node(op_type: str, inputs: list[ir.Value | None], name: str, **attributes: Any) -> ir.Node:
    node = ir.node(op_type, inputs, attributes=attributes, name=name)
    node.outputs[0].name = name
    return node


def _constant(value: Any, name: str, dtype: Any = np.int64) -> ir.Node:
    return _node("Constant", [], name, value=ir.tensor(np.asarray(value, dtype=dtype)))


def _image_step_on_shared_buffers(graph: ir.Graph) -> None:
    """Make the image step's graph read and write a cache buffer the runtime shares
    between past and present (batch, heads, context, head size), as the kernel does: the
    past is the buffer's first `total - S` tokens (`total`: the mask's length, `S`: the
    step's), the new tokens are written after them and the rest of the buffer is kept. A
    past that is not a shared buffer (exactly `total - S` tokens) is read whole and the
    cache grows by the step."""
    inputs = {value.name: value for value in graph.inputs}
    total = _node("Shape", [inputs["attention_mask"]], "image_step_total", start=1, end=2)
    new = _node("Shape", [inputs["input_ids"]], "image_step_new", start=1, end=2)
    held = _node("Sub", [total.outputs[0], new.outputs[0]], "image_step_held")
    zero, axis, end = (_constant([v], n) for v, n in ((0, "image_step_zero"), (2, "image_step_axis"),
                                                        (np.iinfo(np.int64).max, "image_step_end")))
    nodes = [total, new, held, zero, axis, end]
    outputs = {value.name: index for index, value in enumerate(graph.outputs)}
    for name, past in inputs.items():
        if not name.startswith("past_key_values."):
            continue
        uses = list(past.uses())
        used = _node("Slice", [past, zero.outputs[0], held.outputs[0], axis.outputs[0]], f"{name}.held")
        for node, index in uses:
            node.replace_input_with(index, used.outputs[0])
        rest = _node("Slice", [past, total.outputs[0], end.outputs[0], axis.outputs[0]], f"{name}.rest")
        present_name = name.replace("past_key_values.", "present.")
        present = graph.outputs[outputs[present_name]]
        present.name = f"{present_name}.step"
        buffer = _node("Concat", [present, rest.outputs[0]], present_name, axis=2)
        buffer.outputs[0].shape, buffer.outputs[0].type = present.shape, present.type
        graph.outputs[outputs[present_name]] = buffer.outputs[0]
        nodes += [used, rest]
        graph.append(buffer)
    graph.insert_before(next(iter(graph)), nodes)


def decoder_with_fused_text_steps(image_step: ir.Model, text_step: ir.Model, image_token_id: int) -> None:
    """Make ``image_step`` (the model's own masks) one decoder with ``text_step`` (the
    fused kernel): an `If` on whether the step's `input_ids` hold an image token. Both
    branches update a cache buffer the runtime shares between past and present in place
    (and grow a cache it does not share)."""
    _image_step_on_shared_buffers(image_step.graph)
    inputs = [ir.Value(name=value.name, shape=value.shape, type=value.type) for value in image_step.graph.inputs]
    ids = next(value for value in inputs if value.name == "input_ids")
    token = _constant(image_token_id, "image_token")
    is_image = _node("Equal", [ids, token.outputs[0]], "is_image_token")
    as_int = _node("Cast", [is_image.outputs[0]], "image_token_flags", to=ir.DataType.INT32)
    any_image = _node("ReduceMax", [as_int.outputs[0]], "any_image_token", keepdims=0)
    none = _constant(0, "no_image_token", np.int32)
    text_only = _node("Equal", [any_image.outputs[0], none.outputs[0]], "text_only")
    nodes = [token, is_image, as_int, any_image, none, text_only]
    # the text step is the `then` branch: the folder's config reads the cache's update there
    merged = models_in_if(text_step, image_step, inputs, text_only.outputs[0], nodes, (TEXT_STEP, IMAGE_STEP), "decoder",
                          "text_or_image_step")
    image_step.graph = merged.graph
    image_step.functions.clear()
    image_step.functions.update(merged.functions)


def export_parts(loaded: LoadedModel, options: fx2onnx.ExportOptions, image_processor: Any,
                 architecture: VisionLanguageArchitecture) -> dict[str, fx2onnx.ONNXProgram]:
    """The vision model for the processor's one image size, the shared embedding and the
    decoder (with the fused text steps where the runtime's kernel applies)."""
    size = image_size(image_processor)
    model = loaded.model
    plain = parts.without_causal_mask(options)
    vision_options = dataclasses.replace(plain, dynamic_shapes=vision_dynamic_shapes())
    vision = parts.as_loaded(vision_inputs(loaded, size), loaded, static=True)
    inputs = decoder_inputs(loaded, lambda value: parts.as_loaded(value, loaded))
    # image blocks attend both ways: an explicit mask, not the causal kernel's
    decoder_options = dataclasses.replace(plain, dynamic_shapes=parts.decoder_dynamic_shapes(inputs))
    decoder = fx2onnx.dynamo_export(GemmaDecoder(model), **inputs, export_options=decoder_options)
    if options.runtime == "onnxruntime" and not text_step_refusal(loaded.config):
        # text steps (every decode step) through onnxruntime's fused kernel, in one decoder with the above
        inputs = decoder_inputs(loaded, lambda value: parts.as_loaded(value, loaded))
        text_step = fx2onnx.dynamo_export(GemmaTextStep(model), **inputs, export_options=decoder_options)
        decoder_with_fused_text_steps(decoder.model, text_step.model, int(loaded.config.image_token_id))
    width = architecture.row_width(loaded.config)
    return {
        "vision": fx2onnx.dynamo_export(GemmaVision(model), **vision, export_options=vision_options),
        "embedding": fx2onnx.dynamo_export(
            parts.Embedding(model, int(loaded.config.image_token_id), width),
            **parts.embedding_inputs(loaded, width, per_image=True), export_options=plain,
        ),
        "decoder": decoder,
    }


def vision_section(config: Any, filename: str, processor_file: str) -> dict[str, Any]:
    return genai_files.vision_section(filename)


def processor_config(image_processor: Any, config: Any) -> dict[str, Any]:
    """The runtime's Gemma 3 image processor: every image resized to the processor's size
    (height, width), scaled and normalized, channels first ([3, height, width] per image). The
    decoder gives RGB already: the runtime's ConvertRGB here would swap the channels."""
    size = image_size(image_processor)
    transforms = [genai_files.decoded_rgb()]
    transforms.append(genai_files.operation("resize", "Resize", {
        "height": size[0], "width": size[1], "keep_aspect_ratio": 0, "interpolation": genai_files.interpolation(image_processor),
    }))
    transforms += genai_files.scaling(image_processor)
    transforms.append(genai_files.operation("to_channel_first", "Permute3D", {"dims": [2, 0, 1]}))
    return {"processor": {"name": "gemma_3_image_processing", "transforms": transforms}}


def image_sizes_note(image_processor: Any) -> str:
    height, width = image_size(image_processor)
    return f"vision model for {height}x{width} images (the runtime's processor resizes every image to that size)"


def verification_sizes(model: torch.nn.Module, image_processor: Any) -> tuple[tuple[int, int], ...]:
    """One image of the processor's size."""
    return (image_size(image_processor),)


def verification_prompt(model: torch.nn.Module, images: dict[str, torch.Tensor]) -> Prompt:
    """The image's tokens (begin, `mm_tokens_per_image` image tokens, end) between random
    text tokens; transformers is given their `token_type_ids` (the image tokens' two-way
    attention), the decoder the step's ids."""
    config = model.config
    text = prompt_text(config, {int(config.image_token_id), int(config.boi_token_id), int(config.eoi_token_id)})
    image = [int(config.boi_token_id), *[int(config.image_token_id)] * int(config.mm_tokens_per_image), int(config.eoi_token_id)]
    ids = torch.tensor([text[:3] + image + text[3:8]])
    features = model.model.get_image_features(images["pixel_values"]).pooler_output
    return Prompt(ids, {"pixel_values": images["pixel_values"], "token_type_ids": (ids == config.image_token_id).long()},
                  features, np.arange(ids.shape[1], dtype=np.int64)[None],
                  lambda index: np.array([[index]], dtype=np.int64))


def image_features(vision: Any, images: dict[str, torch.Tensor]) -> np.ndarray:
    """The vision model on every image at once (one size)."""
    return run_session(vision, {k: v.numpy() for k, v in images.items()})["image_features"]


ARCHITECTURE = VisionLanguageArchitecture(
    genai_type="gemma3", export_parts=export_parts, vision_section=vision_section, processor_config=processor_config,
    image_sizes_note=image_sizes_note, verification_sizes=verification_sizes, verification_prompt=verification_prompt,
    image_features=image_features, mrope=False, check=check_image_tokens,
)
