"""Phi-4-multimodal (`Phi4MultimodalForCausalLM`) as ONNX Runtime GenAI's `phi4mm` type runs
it, each part cut from the model's own modules:

- vision (`pixel_values` [images, crops, 3, 448, 448], `image_attention_mask` [images,
  crops, 32, 32], `image_sizes` [images, 2] -> `image_features` [image tokens, hidden]):
  the SigLIP tower on every crop, then the image embedding's layout of each image (its
  crops' features cut to the unpadded part, a separator column per row, the global
  separator, the global image), computed in the graph for images of any size and number;
- embedding (`input_ids`, `image_features`, `audio_features` -> `inputs_embeds`): the token
  embedding with the image tokens' rows and the audio tokens' rows taken from the features
  in order, as the model's feature embedding puts them;
- speech (`audio_embeds`, `audio_attention_mask`, `audio_sizes`, `audio_projection_mode`
  -> `audio_features`): the conformer encoder and the projection (vision_language/phi4_speech.py);
- decoder (`inputs_embeds`, `attention_mask`, `position_ids`, the cache -> `logits`,
  `present.*`): the language model and its head (vision_language/parts.py's decode step).

The runtime's processor (phi_multimodal_processor.cpp, onnxruntime-extensions'
Phi4VisionDynamicPreprocess/Phi4VisionProcessor) fixes what the model must have: image
token id 200010 and audio token id 200011 (written `<|endoftext10|>`, `<|endoftext11|>`),
crops of 448 pixels in patches of 14, and 256 + 16 + 1 global tokens per image.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.export import Dim

from fx2onnx.hub.shared.json_files import read_json
import fx2onnx
from fx2onnx.hub.decoders import decode_step
from fx2onnx.hub.loading import LoadedModel
from fx2onnx.hub.shared.genai_config import session_options
from fx2onnx.hub.vision_language import genai_files, parts, phi4_speech
from fx2onnx.hub.vision_language.parts import Holder

GENAI_TYPE = "phi4mm"
# what the runtime's processor hardcodes
IMAGE_TOKEN_ID, AUDIO_TOKEN_ID = 200010, 200011
CROP, PATCH = 448, 14
MASK_SIDE = CROP // PATCH
VISION_PROCESSOR_CONFIG = "vision_processor.json"
VISION_ATTENTION = "fx2onnx_phi4_vision_attention"


def check(config: Any) -> None:
    """A clear error for a configuration the runtime's `phi4mm` processor cannot feed."""
    vision, audio = config.vision_config, config.audio_config
    wrong = [
        f"{name} is {value} (the runtime's processor needs {needed})"
        for name, value, needed in (
            ("vision_config.image_token_id", vision.image_token_id, IMAGE_TOKEN_ID),
            ("audio_config.audio_token_id", audio.audio_token_id, AUDIO_TOKEN_ID),
            ("vision_config.crop_size", vision.crop_size, CROP),
            ("vision_config.image_size", vision.image_size, CROP),
            ("vision_config.patch_size", vision.patch_size, PATCH),
        )
        if int(value) != needed
    ]
    if wrong:
        raise NotImplementedError(
            f"ONNX Runtime GenAI's phi4mm processor cannot feed this Phi-4-multimodal: {'; '.join(wrong)}. Nothing was written."
        )


def _vision_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention of the tower as it runs: when no patch of the call is
    padded transformers drops the mask and SDPA applies the module's `is_causal` (True in
    transformers 5.24's Phi-4 vision attention); otherwise each patch attends the
    unpadded patches both ways. The graph decides at run time, from the mask."""
    length = query.shape[-2]
    causal = torch.ones(length, length, dtype=torch.bool, device=query.device).tril()
    if attention_mask is None:  # transformers dropped it: no patch is padded
        allowed = causal
    elif attention_mask.dtype == torch.bool:
        allowed = attention_mask & (causal | attention_mask.logical_not().any())
    else:
        raise NotImplementedError("The Phi-4-multimodal vision export expects transformers' boolean padding mask.")
    output = nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scaling)
    return output.transpose(1, 2).contiguous(), None


class Phi4Vision(nn.Module):
    """The image embedding's tower, layout and projection for every image of a call."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = Holder(embed_tokens_extend=Holder(image_embed=model.model.embed_tokens_extend.image_embed))

    def forward(self, pixel_values: torch.Tensor, image_attention_mask: torch.Tensor, image_sizes: torch.Tensor) -> dict[str, torch.Tensor]:
        embed = self.model.embed_tokens_extend.image_embed
        images, crops = pixel_values.shape[0], pixel_values.shape[1]
        mask = image_attention_mask.to(torch.bool)
        features = embed.get_img_features(pixel_values.flatten(0, 1), attention_mask=mask.flatten(0, 1))
        dim = features.shape[-1]
        side = int(round(features.shape[1] ** 0.5))  # the compressed grid of a crop (16 at 448 pixels)
        features = features.reshape(images, crops, side * side, dim)
        separator = embed.sub_img_feature_extensor.reshape(1, 1, 1, dim)
        whole = torch.cat([features[:, 0].reshape(images, side, side, dim), separator.expand(images, side, 1, dim)], dim=2)
        sub, valid = _sub_image_rows(features, mask[:, :, 0::2, 0::2], image_sizes // int(embed.crop_size), separator)
        rows = torch.cat([sub, embed.global_img_feature_extensor.expand(images, 1, dim), whole.reshape(images, -1, dim)], dim=1)
        keep = torch.cat([valid, torch.ones(images, 1 + side * (side + 1), dtype=torch.bool, device=valid.device)], dim=1)
        chosen = rows[keep]
        return {"image_features": embed.img_projection_down(nn.functional.gelu(embed.img_projection_up(chosen)))}


def _sub_image_rows(features: torch.Tensor, mask: torch.Tensor, crop_grid: torch.Tensor,
                    separator: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each image's crops (all but the first, the global image) laid out as one grid
    (crop_grid: crops down, across), cut to the unpadded rows and columns (the first
    crop column's and row's mask), a separator after each row: as the image embedding
    lays them out one image at a time. Every image gets as many slots as its crops can
    fill; the valid ones are marked. The crops dim is never sliced: a slice of one crop
    would make torch.export specialize the graph to more crops than one image has."""
    images, crops, tokens, dim = features.shape
    side = mask.shape[-1]
    tall, wide = crop_grid[:, 0:1], crop_grid[:, 1:2]
    sub = torch.arange(crops, device=features.device)[None] - 1  # the crop's place in the grid; -1: the global image
    in_image = (sub >= 0) & (sub < tall * wide)  # the crops past an image's own are padding
    small = mask.to(torch.int64)
    useful_width = (small[:, :, 0, :].sum(-1) * (in_image & (sub < wide))).sum(-1, keepdim=True)
    useful_height = (small[:, :, :, 0].sum(-1) * (in_image & (sub % wide == 0))).sum(-1, keepdim=True)
    slot = torch.arange(crops * (tokens + side), device=features.device)[None]
    row, column = slot // (useful_width + 1), slot % (useful_width + 1)
    valid = row < useful_height
    at_separator = column == useful_width
    index = ((row // side) * wide + column // side + 1) * tokens + (row % side) * side + column % side
    index = torch.where(valid & ~at_separator, index, 0).clamp(max=crops * tokens - 1)
    gathered = torch.gather(features.reshape(images, crops * tokens, dim), 1, index[..., None].expand(-1, -1, dim))
    return torch.where(at_separator[..., None], separator.reshape(1, 1, dim), gathered), valid


class Phi4Embedding(nn.Module):
    """Token embeddings with the image tokens' and the audio tokens' rows from their features."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = Holder(embed_tokens=model.model.embed_tokens)

    def forward(self, input_ids: torch.Tensor, image_features: torch.Tensor, audio_features: torch.Tensor) -> dict[str, torch.Tensor]:
        embeds = self.model.embed_tokens(input_ids)
        embeds = parts.with_feature_rows(embeds, input_ids == IMAGE_TOKEN_ID, image_features)
        return {"inputs_embeds": parts.with_feature_rows(embeds, input_ids == AUDIO_TOKEN_ID, audio_features)}


class Phi4Decoder(nn.Module):
    """The language model (its embeddings unused: the embedding model's) and its head over `inputs_embeds`."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model.model
        self.lm_head = model.lm_head
        self.cache_argument = decode_step.cache_argument(model.model)

    def forward(self, inputs_embeds, attention_mask, position_ids, past_key_values) -> dict[str, Any]:
        output = self.model(inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=True, **{self.cache_argument: past_key_values})
        return {"logits": self.lm_head(output.last_hidden_state), "present": decode_step.output_cache(output)}


def example_images() -> dict[str, torch.Tensor]:
    """Two images' processed inputs: one of 1 x 2 crops whose last columns are padding, one
    of a single crop (its second crop slot padding, as the processor pads)."""
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randn(2, 3, 3, CROP, CROP, generator=generator)
    mask = torch.ones(2, 3, MASK_SIDE, MASK_SIDE)
    mask[0, 2, :, -5:] = 0
    sizes = torch.tensor([[CROP, 2 * CROP], [CROP, CROP]])
    return {"pixel_values": pixels, "image_attention_mask": mask, "image_sizes": sizes}


def image_token_counts(image_attention_mask: torch.Tensor, image_sizes: torch.Tensor) -> list[int]:
    """Each image's number of image tokens (its rows of `image_features`), from its processed inputs."""
    images, crops = image_attention_mask.shape[:2]
    side = MASK_SIDE // 2
    mask = image_attention_mask[:, :, 0::2, 0::2].to(torch.bool)
    _, valid = _sub_image_rows(torch.zeros(images, crops, side * side, 1), mask, image_sizes // CROP, torch.zeros(1))
    return (valid.sum(-1) + 1 + side * (side + 1)).tolist()


def export_vision(loaded: LoadedModel, options: fx2onnx.ExportOptions) -> fx2onnx.ONNXProgram:
    """The vision model for any number of images of any number of crops."""
    # the tower's own config (the loaded config is another object): the one its attention reads
    vision_config = loaded.model.model.embed_tokens_extend.image_embed.img_processor.config
    images = parts.as_loaded(example_images(), loaded)
    dynamic = {"pixel_values": {0: Dim.AUTO, 1: Dim.AUTO}, "image_attention_mask": {0: Dim.AUTO, 1: Dim.AUTO},
               "image_sizes": {0: Dim.AUTO}}
    vision_options = dataclasses.replace(parts.without_causal_mask(options), dynamic_shapes=dynamic)
    implementation = vision_config._attn_implementation
    if implementation != "sdpa":  # the eager attention ignores is_causal: both ways over the unpadded patches
        return fx2onnx.dynamo_export(Phi4Vision(loaded.model), **images, export_options=vision_options)
    with parts.attention_implementation(vision_config, VISION_ATTENTION, _vision_attention, masks_like="sdpa"):
        return fx2onnx.dynamo_export(Phi4Vision(loaded.model), **images, export_options=vision_options)


def embedding_inputs(loaded: LoadedModel) -> dict[str, torch.Tensor]:
    """Two sequences with 3 image and 2 audio tokens."""
    hidden = int(loaded.config.hidden_size)
    ids = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(0))
    ids[0, 2:4] = IMAGE_TOKEN_ID
    ids[1, 1] = IMAGE_TOKEN_ID
    ids[1, 5:7] = AUDIO_TOKEN_ID
    image = torch.randn(3, hidden, generator=torch.Generator().manual_seed(1))
    audio = torch.randn(2, hidden, generator=torch.Generator().manual_seed(2))
    return parts.as_loaded({"input_ids": ids, "image_features": image, "audio_features": audio}, loaded)


def export_parts(loaded: LoadedModel, options: fx2onnx.ExportOptions, speech: bool = True) -> dict[str, fx2onnx.ONNXProgram]:
    """The "vision", "embedding" and "decoder" programs, and the "speech" one unless told not to."""
    check(loaded.config)
    programs = {"vision": export_vision(loaded, options)}
    if speech:
        programs["speech"] = phi4_speech.export_speech(loaded, options)
    programs["embedding"] = fx2onnx.dynamo_export(
        Phi4Embedding(loaded.model), **embedding_inputs(loaded), export_options=parts.without_causal_mask(options),
    )
    inputs = parts.decode_step_over_embeds(loaded, loaded.model.model, int(loaded.config.hidden_size), mrope=False)
    causal = decode_step.attends_causally(loaded.config)
    decoder_options = dataclasses.replace(
        options, dynamic_shapes=parts.decoder_dynamic_shapes(inputs), causal_mask_input="attention_mask" if causal else None
    )
    programs["decoder"] = fx2onnx.dynamo_export(Phi4Decoder(loaded.model), **inputs, export_options=decoder_options)
    return programs


def phi4mm_genai_config(config: Any, generation_config: Any, files: dict[str, str], decoder: Any) -> dict[str, Any]:
    """genai_config.json: the decoder fed `inputs_embeds`, the embedding taking both
    features, the vision model and the speech model (when ``files`` has one; without it
    the runtime runs images and text) with their processors' configurations."""
    written = genai_files.embeds_fed_config(config, generation_config, files, decoder, ["image_features", "audio_features"])
    model = written["model"]
    model["type"] = GENAI_TYPE
    model["vision"] = {
        "filename": files["vision"], "config_filename": VISION_PROCESSOR_CONFIG, "session_options": session_options(),
        "inputs": {"pixel_values": "pixel_values", "attention_mask": "image_attention_mask", "image_sizes": "image_sizes"},
        "outputs": {"image_features": "image_features"},
    }
    if "speech" in files:
        model["speech"] = phi4_speech.genai_speech_section(files["speech"], session_options())
    else:  # cleared explicitly: the runtime's defaults name a speech processor file
        model["speech"] = {"filename": "", "config_filename": ""}
    return written


def image_processor_settings(folder: Path) -> dict[str, Any]:
    """The source's image processor settings (preprocessor_config.json, or the image
    processor's part of processor_config.json), read as JSON: transformers' Phi-4 image
    processor needs torchvision to load, the folder does not."""
    for name in ("preprocessor_config.json", "processor_config.json"):
        path = folder / name
        if path.is_file():
            settings = read_json(path)
            return settings.get("image_processor", settings)
    return {}


def vision_processor_config(settings: dict[str, Any]) -> dict[str, Any]:
    """The runtime's Phi-4 image steps doing what transformers' Phi4MultimodalImageProcessor
    does with ``settings``: crops of 448 up to `dynamic_hd`, scaled and normalized, the
    global image resized by bicubic."""
    size = settings.get("size") or {"height": CROP, "width": CROP}
    if (int(size.get("height", CROP)), int(size.get("width", CROP)), int(settings.get("patch_size", PATCH))) != (CROP, CROP, PATCH):
        raise NotImplementedError(
            f"The image processor's size {size} and patch_size {settings.get('patch_size')} differ from the 448-pixel crops "
            "of 14-pixel patches that ONNX Runtime GenAI's phi4mm processor makes. Nothing was written."
        )
    dynamic_hd = int(settings.get("dynamic_hd", 36))
    scaling = genai_files.scaling(_Settings(settings))
    if scaling:  # the first step after the crops takes their image alone, not their mask (the step's second output)
        scaling[0]["operation"]["inputs"] = [":0"]
    return {"processor": {"name": "phi_4_vision_processor", "transforms": [
        genai_files.decoded_rgb(),
        genai_files.operation("phi4_vision_dynamic_preprocess", "Phi4VisionDynamicPreprocess",
                              {"dynamic_hd": dynamic_hd, "dyhd_base_resolution": CROP}),
        *scaling,
        {"operation": {"name": "phi4_vision_processor", "type": "Phi4VisionProcessor",
                       "inputs": [":0", "phi4_vision_dynamic_preprocess:1"],
                       "attrs": {"dyhd_base_resolution": CROP, "interpolation": "CUBIC"}}},
    ], "output_aligner": "phi4-vision-aligner"}}


class _Settings:
    """Image processor settings read as attributes, with Phi4MultimodalImageProcessor's defaults."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.do_rescale = settings.get("do_rescale", True)
        self.rescale_factor = settings.get("rescale_factor", 1 / 255)
        self.do_normalize = settings.get("do_normalize", True)
        self.image_mean = settings.get("image_mean", [0.5, 0.5, 0.5])
        self.image_std = settings.get("image_std", [0.5, 0.5, 0.5])
