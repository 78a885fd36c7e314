"""The image-text-to-text folder as Transformers.js loads it (`--runtime standard`):
its `ImageTextToText` model type reads `onnx/vision_encoder.onnx` (`image_features`),
`onnx/embed_tokens.onnx` (`input_ids` -> `inputs_embeds`) and `onnx/decoder_model_merged.onnx`,
and puts the image features into the image tokens' rows itself, in JavaScript. The vision
and decoder models are those of ONNX Runtime GenAI's folder (genai_files.py names them as
Transformers.js does); the embedding is the token embedding alone (parts.TokenEmbedding),
as wide as the vision model's rows (Qwen3-VL's carry DeepStack features: zeros at text
tokens; Transformers.js copies a features row over an image token's whole row). A hybrid
text model's states take the names Transformers.js feeds (decoders/state_names.py).

Which architectures get this folder is one table: those whose inputs Transformers.js feeds
as the folder's models take them, each run in Transformers.js in Node by the tests. A row
names its own architecture (how its parts are exported and verified) where ONNX Runtime
GenAI has no type for it (architectures.py holds those of the runtime's types).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fx2onnx.hub.decoders import text_only
from fx2onnx.hub.decoders.client_support import TRANSFORMERS_JS
from fx2onnx.hub.request import Refusal
from fx2onnx.hub.shared.folder_files import processor_file_settings
from fx2onnx.hub.shared.json_files import read_json_if_present, write_json_file
from fx2onnx.hub.vision_language import (
    gemma3_transformers_js, gemma3n, gemma4, glm_ocr, idefics3, lfm2_vl, lfm3_vl, lighton_ocr, llava, paligemma, qwen2_vl,
    qwen3_5, qwen3_vl,
)
from fx2onnx.hub.vision_language.architecture import VisionLanguageArchitecture
from fx2onnx.hub.vision_language.architectures import architecture_of
from fx2onnx.hub.vision_language.transformers_js_processors import (
    TokenText, added_token_text, feature_extractor_settings, gemma3n_entries, idefics3_entries, lighton_ocr_entries,
    lighton_ocr_image_settings, mistral3_entries, mistral3_image_settings,
)

IMAGE_PROCESSOR_FILE, PROCESSOR_FILE = "preprocessor_config.json", "processor_config.json"


@dataclass(frozen=True)
class TransformersJsRow:
    """One architecture as Transformers.js runs its folder.

    Attributes:
        note: what export-hf tells of the folder in Transformers.js.
        processor_class: the processor Transformers.js's `AutoProcessor` builds when
            `preprocessor_config.json` names it (`processor_class`), or None where that
            processor reads more than the folder holds.
        architecture: how the parts are exported and verified, for an architecture ONNX
            Runtime GenAI has no type for (None: its row in architectures.py).
        processor_settings: `preprocessor_config.json` settings written for Transformers.js's
            image processor where it reads a setting transformers' ignores.
        image_settings: (config, the source's image processor settings) -> more such
            settings, computed (transformers_js_processors.py).
        processor_entries: (config, the tokenizer's token texts) -> `processor_config.json`
            entries Transformers.js's processor class reads, each written where the source's
            file lacks it (transformers_js_processors.py).
        processor_class_when: config -> whether `processor_class` is named for that config
            (None: always), where the processor matches transformers' for some configs alone.
        feature_extractor: whether the processor builds a feature extractor from
            `preprocessor_config.json` too (its settings merged in; no class named where the
            source has none: the processor would fail to load).
    """

    note: str
    processor_class: str | None = None
    architecture: VisionLanguageArchitecture | None = None
    processor_settings: dict[str, Any] = field(default_factory=dict)
    image_settings: Callable[[Any, dict[str, Any]], dict[str, Any]] | None = None
    processor_entries: Callable[[Any, TokenText], dict[str, Any]] | None = None
    processor_class_when: Callable[[Any], bool] | None = None
    feature_extractor: bool = False


IDEFICS3_NOTE = (
    TRANSFORMERS_JS + " runs this folder ({name}) on a prompt's crops (pixel_values and pixel_attention_mask) "
    "as its Idefics3Processor cuts them, reading image_seq_len from processor_config.json (written from the config "
    "where the source has none): transformers' prompt ids and crop masks. Its Idefics3ImageProcessor resizes with "
    "sharp's Lanczos filter, not PIL's: a crop it scales (every image's whole, and the crops of an image not already "
    "of the longest edge) gets other pixels than transformers'. ONNX Runtime GenAI has no type for this architecture."
)

QWEN_IMAGES = (
    " Its Qwen2VLImageProcessor takes one image per call, so a prompt with several images needs its pixel_values "
    "and image_grid_thw processed otherwise (the vision model takes them all in one run)."
)
# Transformers.js's RawImage.resize (line 19137 of the pinned release's dist/transformers.node.mjs) resizes in Node
# with sharp's `affine` and the processor's bicubic or bilinear interpolator (lines 19169-19174), where transformers'
# PIL image processors resize with PIL's antialiasing filters: same sizes, other pixels
SHARP_RESIZE = (
    " Its image processor resizes with sharp, not PIL: an image it resizes gets transformers' prompt ids (and grid) "
    "but other pixel values; an image already of the size it resizes to keeps transformers' pixels."
)
PIXTRAL_FILES = (
    " Its PixtralProcessor reads the image tokens and patch sizes from processor_config.json, and its image processor "
    "the patch it resizes to as patch_size x spatial_merge_size from preprocessor_config.json (both written here)."
)
# what Transformers.js's Qwen-VL class (Qwen2VLForConditionalGeneration, every Qwen-VL kind's base) feeds
# after a prompt: `_get_text_only_rope_index` gives `max + 1n + BigInt(dims[1])` as a prompt's mRoPE delta where
# transformers' is max + 1 - length, and `prepare_inputs_for_generation` sets `pixel_values` to null (not
# undefined), so generic_text_to_text_forward gives a one-token step ones over the past as its attention mask
QWEN_GENERATION = (
    f" {TRANSFORMERS_JS} gives transformers' tokens for one prompt with images; after the first token it feeds a "
    "prompt without images other positions than transformers' (its text-only mRoPE delta adds the prompt's length "
    "where transformers subtracts it) and a left-padded batch a mask that no longer hides the padding."
)


def qwen_note(name: str, folder: str = "", genai: str = "") -> str:
    """The note of a Qwen-VL kind's folder (``name``: Transformers.js's class) in Transformers.js."""
    return f"{TRANSFORMERS_JS} runs this folder ({name}){folder}.{QWEN_IMAGES}{SHARP_RESIZE}{QWEN_GENERATION}{genai}"


DEEPSTACK_ROWS = (
    "; its rows are wider than the embeddings (the DeepStack features beside them, zeros at text tokens), which "
    "Transformers.js copies whole"
)
LINEAR_STATES = (
    "; its decoder takes the linear-attention layers' states as past_conv.<layer> and past_recurrent.<layer>, as "
    "Transformers.js feeds them"
)


TRANSFORMERS_JS_ARCHITECTURES: dict[str, TransformersJsRow] = {
    # its vision_encoder takes `pixel_values` and `image_grid_thw` of a prompt's images, as Transformers.js's
    # Qwen2VLForConditionalGeneration feeds them; its decoder the 3-D mRoPE positions Transformers.js
    # computes (get_rope_index)
    "qwen2_5_vl": TransformersJsRow(qwen_note("Qwen2_5_VLForConditionalGeneration"), processor_class="Qwen2_5_VLProcessor"),
    # as Qwen2.5-VL's, its vision_encoder's grid input named `grid_thw` (Transformers.js's name for Qwen2-VL)
    "qwen2_vl": TransformersJsRow(
        qwen_note("Qwen2VLForConditionalGeneration", genai=" ONNX Runtime GenAI has no Qwen2-VL type."),
        processor_class="Qwen2VLProcessor", architecture=qwen2_vl.ARCHITECTURE,
    ),
    # as Qwen2.5-VL's, its rows wider than the embeddings: the vision_encoder's features row the merger's then each
    # DeepStack merger's, embed_tokens' row the embedding then zeros. Transformers.js checks only the features' count
    # against the image tokens' and copies each features row over the whole row (default_merge_input_ids_with_features);
    # the decoder adds each DeepStack block after its layer at every position (zeros at text tokens)
    "qwen3_vl": TransformersJsRow(qwen_note("Qwen3VLForConditionalGeneration", DEEPSTACK_ROWS), processor_class="Qwen3VLProcessor"),
    "qwen3_vl_moe": TransformersJsRow(
        qwen_note("Qwen3VLMoeForConditionalGeneration", DEEPSTACK_ROWS, " ONNX Runtime GenAI has no Qwen3-VL-MoE type."),
        processor_class="Qwen3VLProcessor", architecture=qwen3_vl.MOE_ARCHITECTURE,
    ),
    # Qwen3-VL's path (Qwen3_5ForConditionalGeneration extends Qwen3VLForConditionalGeneration) without DeepStack; the
    # decoder's gated delta-rule states named as getCacheNames names those of the text config's `qwen3_5_text`
    "qwen3_5": TransformersJsRow(
        qwen_note("Qwen3_5ForConditionalGeneration", LINEAR_STATES, " ONNX Runtime GenAI has no Qwen3.5 vision-language type."),
        processor_class="Qwen3VLProcessor", architecture=qwen3_5.ARCHITECTURE,
    ),
    "qwen3_5_moe": TransformersJsRow(
        qwen_note("Qwen3_5MoeForConditionalGeneration", LINEAR_STATES,
                  " ONNX Runtime GenAI has no Qwen3.5-MoE vision-language type."),
        processor_class="Qwen3VLProcessor", architecture=qwen3_5.MOE_ARCHITECTURE,
    ),
    # Qwen2.5-VL's path with its own mRoPE positions (GlmOcrForConditionalGeneration._get_multimodal_rope_positions,
    # transformers' for images); Glm46VProcessor: Qwen2VLProcessor's expansion of GLM's `<|image|>` placeholder
    "glm_ocr": TransformersJsRow(
        qwen_note("GlmOcrForConditionalGeneration", genai=" ONNX Runtime GenAI has no GLM-OCR type."),
        processor_class="Glm46VProcessor", architecture=glm_ocr.ARCHITECTURE,
    ),
    # its vision_encoder takes `pixel_values` of any number of images of the tower's size; 1-D positions from
    # the mask. Its LlavaProcessor (src/models/llava/processing_llava.js:21-23) counts (height / patch) x
    # (width / patch) + num_additional_image_tokens image tokens, where transformers' subtracts the class token the
    # "default" strategy drops: with a released processor_config.json one token more than the features, which its
    # merge refuses (src/models/modeling_utils.js:1684). Under the "full" strategy (the class token kept) both
    # count the same: LlavaProcessor named for those configs alone
    "llava": TransformersJsRow(
        f"{TRANSFORMERS_JS} runs this folder (LlavaForConditionalGeneration) on the tokens and pixel_values "
        "transformers' LlavaProcessor gives; its own LlavaProcessor, which the folder names where the config's "
        "vision_feature_select_strategy is \"full\", counts num_additional_image_tokens (the class token) among an "
        "image's tokens whatever the strategy (src/models/llava/processing_llava.js:21-23): under the \"default\" "
        "strategy, which drops the class token, one image token more than the vision model gives features for, which "
        "its merge refuses (\"Number of tokens and features do not match\"), so such a folder names no processor "
        "class. ONNX Runtime GenAI has no LLaVA type.",
        architecture=llava.ARCHITECTURE, processor_class="LlavaProcessor", processor_class_when=llava.full_strategy,
    ),
    # Idefics3ForConditionalGeneration's path (SmolVLM's the same): its vision_encoder takes `pixel_values` and the
    # bool `pixel_attention_mask` of a prompt's crops; 1-D positions from the mask. Its Idefics3Processor reads
    # `image_seq_len` from processor_config.json (written from the config where the source has none)
    "idefics3": TransformersJsRow(IDEFICS3_NOTE.format(name="Idefics3ForConditionalGeneration"), architecture=idefics3.ARCHITECTURE,
                                  processor_class="Idefics3Processor", processor_entries=idefics3_entries),
    "smolvlm": TransformersJsRow(IDEFICS3_NOTE.format(name="SmolVLMForConditionalGeneration"), architecture=idefics3.ARCHITECTURE,
                                 processor_class="SmolVLMProcessor", processor_entries=idefics3_entries),
    # LlavaForConditionalGeneration's path: `pixel_values` of one image, 1-D positions from the mask.
    # Its PixtralProcessor reads processor_config.json's image tokens and patch sizes, and its
    # PixtralImageProcessor a number patch_size and a spatial_merge_size in preprocessor_config.json
    # (transformers_js_processors.py)
    "mistral3": TransformersJsRow(
        f"{TRANSFORMERS_JS} runs this folder (Mistral3ForConditionalGeneration) with one image per prompt: the "
        "vision model takes one image ([1, 3, height, width]) at a time." + PIXTRAL_FILES + SHARP_RESIZE,
        processor_class="PixtralProcessor", image_settings=mistral3_image_settings, processor_entries=mistral3_entries,
    ),
    # Mistral 3's path under LightOnOCR's module names (lighton_ocr.py): LlavaForConditionalGeneration's
    # `pixel_values` of one image, 1-D positions from the mask; Transformers.js has no LightOnOCR processor: its
    # PixtralProcessor with empty break and end tokens writes LightOnOcrProcessor's tokens
    "lighton_ocr": TransformersJsRow(
        f"{TRANSFORMERS_JS} runs this folder (LightOnOcrForConditionalGeneration) with one image per prompt: the "
        "vision model takes one image ([1, 3, height, width]) at a time." + PIXTRAL_FILES + " Its break and end tokens "
        "are empty there, so that its rows join into LightOnOcrProcessor's run of image tokens." + SHARP_RESIZE
        + " ONNX Runtime GenAI has no LightOnOCR type.",
        processor_class="PixtralProcessor", architecture=lighton_ocr.ARCHITECTURE,
        image_settings=lighton_ocr_image_settings, processor_entries=lighton_ocr_entries,
    ),
    # LlavaForConditionalGeneration's path: `pixel_values` of the processor's one size; rows one column wider, a
    # flag the decoder reads for the image tokens' two-way attention (gemma3_transformers_js.py)
    "gemma3": TransformersJsRow(
        f"{TRANSFORMERS_JS} runs this folder (Gemma3ForConditionalGeneration): its image_features and inputs_embeds "
        "rows are one column wider than the hidden size, the last column 1 at image rows and 0 at text rows, which "
        "the decoder reads to let an image's tokens attend each other both ways, as transformers does with "
        "token_type_ids. Its vision model takes any number of images of the image processor's one size." + SHARP_RESIZE,
        processor_class="Gemma3Processor", architecture=gemma3_transformers_js.ARCHITECTURE,
    ),
    # LlavaForConditionalGeneration's path: `pixel_values` of the tower's size, positions from 1; the decoder
    # attends both ways over a step without a past (the prompt, transformers' prefix: paligemma.py)
    "paligemma": TransformersJsRow(
        f"{TRANSFORMERS_JS} runs this folder (PaliGemmaForConditionalGeneration): its decoder lets a step without a "
        "past (the whole prompt, as Transformers.js runs it) attend both ways, as transformers does over the prefix "
        "its processor marks with token_type_ids 0, and any later step causally; a prompt with a suffix of "
        "token_type_ids 1 is not what the folder runs." + SHARP_RESIZE + " ONNX Runtime GenAI has no PaliGemma type.",
        processor_class="PaliGemmaProcessor", architecture=paligemma.ARCHITECTURE,
    ),
    # an encoder-decoder: its own recipe writes four models, an encoder_model besides (florence2.py,
    # recipes/encoder_decoder_image_text_to_text.py); Transformers.js puts the image features before the prompt's
    # embeddings itself (Florence2ForConditionalGeneration._merge_input_ids_with_image_features)
    "florence2": TransformersJsRow(
        f"{TRANSFORMERS_JS} runs this folder (Florence2ForConditionalGeneration): vision_encoder, embed_tokens, "
        "encoder_model and decoder_model_merged; it puts each image's features before its prompt's embeddings where "
        "transformers' processor writes image tokens, and its Florence2Processor expands the task prompts "
        "(\"<CAPTION>\", \"<OD>\", ...) from the preprocessor_config.json written here. The image processor resizes "
        "every image to one size; Transformers.js's CLIPImageProcessor resizes with sharp, whose pixels differ from PIL's. "
        "ONNX Runtime GenAI has no Florence-2 type.",
        processor_class="Florence2Processor",
    ),
    # Gemma3nForConditionalGeneration's path (gemma4.py): vision_encoder on the processor's padded patches and their
    # positions, audio_encoder (loaded whatever the prompt), embed_tokens giving per_layer_inputs, positions from 0
    "gemma4": TransformersJsRow(
        f"{TRANSFORMERS_JS} runs this folder (Gemma4ForConditionalGeneration) on the input_ids, pixel_values and "
        "image_position_ids transformers' Gemma4Processor gives (any image size: its token count varies with the "
        "image's; the patches padded to the saved processor's max_soft_tokens, the one count the vision model takes), "
        "and input_features with input_features_mask for audio; its own Gemma4Processor puts two newlines before "
        "and after each image's tokens (src/models/gemma4/processing_gemma4.js:79-81), which transformers' does not "
        "(replace_image_token: begin, image tokens, end), and its Gemma4ImageProcessor resizes with sharp, "
        "whose pixels differ from PIL's. embed_tokens gives per_layer_inputs beside inputs_embeds. ONNX Runtime "
        "GenAI has no Gemma 4 vision-language type.",
        architecture=gemma4.ARCHITECTURE,
    ),
    # Gemma 4's path, the class's own (gemma3n.py): vision_encoder on `pixel_values` alone (timm's MobileNetV5, every
    # image of the processor's one size), audio_encoder (loaded whatever the prompt) giving the processor's fixed count
    # of rows a clip, embed_tokens giving per_layer_inputs and the vision and audio vocabularies' embeddings. Its
    # Gemma3nProcessor lays out an image's and a clip's tokens as transformers' (newlines around both: the same ids)
    # and reads both processors from preprocessor_config.json: named. Its feature extractor's spectrogram frames by
    # frame_length (src/models/gemma3n/feature_extraction_gemma3n.js:34-38), transformers' unfolds frame_length + 1
    # samples: 73 frames of a 12000-sample clip (padded to 12032) against transformers' 72, the 72 within 1.3e-5
    "gemma3n": TransformersJsRow(
        f"{TRANSFORMERS_JS} runs this folder (Gemma3nForConditionalGeneration) through its Gemma3nProcessor, which "
        "the folder names (image_seq_length and audio_seq_length from the config where processor_config.json lacks "
        "them; the feature extractor's settings beside the image processor's in preprocessor_config.json) and which "
        "gives transformers' input_ids and, for an image of the image processor's size, its pixel_values (every "
        "image resized to that one size, vision_soft_tokens_per_image tokens each; the vision model takes any "
        "number of images), and input_features with input_features_mask for audio (audio_soft_tokens_per_image "
        "tokens a clip, the rows past a clip's end the audio padding embedding, as transformers merges them). "
        "embed_tokens gives per_layer_inputs beside inputs_embeds." + SHARP_RESIZE + " Its "
        "Gemma3nAudioFeatureExtractor frames a clip by frame_length samples where transformers' takes one more "
        "(its preemphasis reads frame_length + 1; src/models/gemma3n/feature_extraction_gemma3n.js:34-38), so a clip "
        "whose padded length less frame_length is a multiple of hop_length gets one log-mel frame more than "
        "transformers' (the others equal): for such clips give the model transformers' input_features. The vision "
        "tower is timm's: export-hf needs timm (the vision extra). ONNX Runtime GenAI has no Gemma 3n type.",
        architecture=gemma3n.ARCHITECTURE, processor_class="Gemma3nProcessor", processor_entries=gemma3n_entries,
        feature_extractor=True,
    ),
    # its vision_encoder takes the tiles of a prompt's images as Lfm2VlForConditionalGeneration feeds them (its
    # forward_params: pixel_values, pixel_attention_mask, spatial_shapes); 1-D positions from the mask; the decoder's
    # convolution states named as getCacheNames names those of the text config's `lfm2`
    # Its Lfm2VlImageProcessor first resizes every image to `size` where do_resize is set (ImageProcessor.preprocess),
    # which transformers' ignores (its _preprocess sets do_resize and resizes by smart_resize and the tile grid alone):
    # the folder's preprocessor_config.json says do_resize false. Its smart_resize rounds with Math.round (half up),
    # transformers' round_by_factor with Python's round (half to even)
    "lfm2_vl": TransformersJsRow(
        f"{TRANSFORMERS_JS} runs this folder (Lfm2VlForConditionalGeneration) on a prompt's tiles (pixel_values, "
        "pixel_attention_mask and spatial_shapes) as its Lfm2VlProcessor cuts them; its decoder takes the LFM2 "
        "convolution states as past_conv.<layer>, as Transformers.js feeds them. preprocessor_config.json says "
        "do_resize false, which transformers' Lfm2VlImageProcessor ignores and without which Transformers.js's resizes "
        "every image to `size` before tiling it. Its processor resizes without antialiasing (transformers' with "
        "torchvision's antialiased filter), so an image it scales down gets other pixels than transformers', and rounds "
        "a side half-way to a multiple of patch x downsample factor up where transformers rounds it to even (a 400-pixel "
        "side: 416 there, 384 in transformers), so such an image gets other tokens. ONNX Runtime GenAI has no LFM2-VL type.",
        processor_class="Lfm2VlProcessor", architecture=lfm2_vl.ARCHITECTURE, processor_settings={"do_resize": False},
    ),
    # its vision_encoder takes `pixel_values` and `image_grid_thw` of a prompt's images (Lfm3VlForConditionalGeneration's
    # forward_params); 1-D positions from the mask; the decoder's convolution states named as getCacheNames names
    # those of the text config's `lfm3`. transformers saves its image processor as Qwen2VLImageProcessor, which
    # Transformers.js's AutoImageProcessor builds (not its Lfm3VlImageProcessor, which takes several images)
    "lfm3_vl": TransformersJsRow(
        f"{TRANSFORMERS_JS} runs this folder (Lfm3VlForConditionalGeneration) on a prompt's images (pixel_values and "
        "image_grid_thw) as the Qwen image processor cuts them; its decoder takes the LFM3 convolution states as "
        "past_conv.<layer>, as Transformers.js feeds them. Its Qwen image processor resizes with sharp, whose bicubic "
        "filter is not PIL's: an image it resizes gets other pixels than transformers' (one whose sides are multiples "
        "of the merged patch gets transformers')." + QWEN_IMAGES + " ONNX Runtime GenAI has no LFM3-VL type.",
        processor_class="Lfm3VlProcessor", architecture=lfm3_vl.ARCHITECTURE,
    ),
}


# model type -> why Transformers.js cannot give transformers' answer with this folder's models
NOT_SERVED = {
    "llava_onevision": (
        "Transformers.js runs it as its LlavaForConditionalGeneration (models.js exports LlavaOnevisionForConditionalGeneration "
        "as that class), whose forward_params (input_ids, attention_mask, pixel_values, position_ids, past_key_values) drop "
        "image_sizes before the vision model runs; transformers' LLaVA-OneVision needs each image's size to choose the grid "
        "of its crops and to unpad their features (pack_image_features, with image_newline rows), which a vision model fed "
        "pixel_values alone cannot tell."
    ),
}


def transformers_js_refusal(config: Any) -> Refusal | None:
    """Why export-hf writes no Transformers.js folder for ``config``'s architecture, or None."""
    model_type = getattr(config, "model_type", None)
    if model_type in TRANSFORMERS_JS_ARCHITECTURES:
        return None
    reason = f" For {model_type}: {NOT_SERVED[model_type]}" if model_type in NOT_SERVED else ""
    try:
        architecture_of(config)
        works = ("`fx2onnx export-hf <model> --output <folder>` (--runtime onnxruntime, the default) writes its folder for "
                 "ONNX Runtime GenAI.")
    except NotImplementedError:  # no ONNX Runtime GenAI folder either: what works is said for the language model
        works = text_only.command_hint(config)
    return Refusal(NotImplementedError, (
        f"--runtime standard writes image-text-to-text folders in Transformers.js's layout (vision_encoder, embed_tokens "
        f"and decoder_model_merged, the image features merged by Transformers.js; an encoder-decoder's encoder_model besides) for model types "
        f"{', '.join(TRANSFORMERS_JS_ARCHITECTURES)}; {model_type} is not one of them.{reason} Nothing was written. {works}"
    ))


def transformers_js_architecture(config: Any) -> VisionLanguageArchitecture:
    """The architecture of ``config``'s Transformers.js folder: the row's own, or the one
    ONNX Runtime GenAI's folder has (architectures.py, with its checks)."""
    row = TRANSFORMERS_JS_ARCHITECTURES.get(getattr(config, "model_type", None))
    if row is not None and row.architecture is not None:
        row.architecture.check(config)  # a configuration Transformers.js cannot run: a clear error
        return row.architecture
    return architecture_of(config)


def transformers_js_hint(config: Any) -> str:
    """For a refusal of ONNX Runtime GenAI's folder: the command that writes Transformers.js's
    folder for ``config``'s architecture, or nothing where there is none."""
    if getattr(config, "model_type", None) not in TRANSFORMERS_JS_ARCHITECTURES:
        return ""
    # an encoder-decoder's default task is text2text-generation (loading.default_task): the task is to be given
    task = " --task image-text-to-text" if getattr(config, "is_encoder_decoder", False) else ""
    return f" `fx2onnx export-hf <model> --output <folder>{task} --runtime standard` writes its folder for {TRANSFORMERS_JS}."


def text_folder_note(config: dict[str, Any]) -> str | None:
    """For a text2text-generation folder whose config.json is ``config``: what Transformers.js
    loads instead where it runs the model type as image-text-to-text (an encoder-decoder
    row: Florence-2), else None."""
    model_type = config.get("model_type")
    if model_type not in TRANSFORMERS_JS_ARCHITECTURES or not config.get("is_encoder_decoder"):
        return None
    return (f"{TRANSFORMERS_JS} loads {model_type} as image-text-to-text (vision_encoder, embed_tokens, encoder_model "
            "and decoder_model_merged), not this text2text-generation folder (its text model alone, for onnxruntime): "
            "`fx2onnx export-hf <model> --output <folder> --task image-text-to-text --runtime standard` writes its folder.")


def transformers_js_note(config: Any) -> str:
    """What export-hf says of the folder of ``config``'s architecture in Transformers.js."""
    return TRANSFORMERS_JS_ARCHITECTURES[config.model_type].note


def image_processor_settings(source: Path) -> dict[str, Any] | None:
    """The source's image processor settings (folder_files.processor_file_settings); None without any."""
    return processor_file_settings(source, "image_processor")


def write_processor_class(source: Path, staging: Path, config: Any) -> list[str]:
    """`preprocessor_config.json` naming the processor Transformers.js's `AutoProcessor` is
    to build (released checkpoints name it; an image processor saved alone does not), written
    into ``staging`` from the source's image processor settings (with the row's settings for
    Transformers.js), and the `processor_config.json` entries that processor reads
    (write_processor_entries); returns the files' names, or nothing where there are no
    settings or no class to name. Transformers.js reads `preprocessor_config.json` alone for
    `AutoProcessor` (it fails without it), where transformers 5 may have saved the settings
    inside `processor_config.json` only (which the folder keeps, for the classes that read it:
    Gemma3Processor's `image_seq_length`)."""
    row = TRANSFORMERS_JS_ARCHITECTURES[config.model_type]
    settings = image_processor_settings(source)
    if row.processor_class is None or settings is None:
        return []
    if row.processor_class_when is not None and not row.processor_class_when(config):
        return []
    if row.feature_extractor:
        audio = feature_extractor_settings(source, settings)
        if audio is None:
            return []
        settings = {**audio, **settings}
    settings.setdefault("processor_class", row.processor_class)
    settings.update(row.processor_settings)  # what the client must do otherwise
    if row.image_settings is not None:
        settings.update(row.image_settings(config, dict(settings)))
    return [write_json_file(staging, IMAGE_PROCESSOR_FILE, settings), *write_processor_entries(source, staging, config)]


def write_processor_entries(source: Path, staging: Path, config: Any) -> list[str]:
    """`processor_config.json` in ``staging``: the source's (or an empty one) with each entry
    of the row's `processor_entries` it lacks (the source's own values are kept: transformers'
    processor reads them too); returns its name, or nothing for a row without entries."""
    entries = TRANSFORMERS_JS_ARCHITECTURES[config.model_type].processor_entries
    if entries is None:
        return []
    content = read_json_if_present(source / PROCESSOR_FILE, {})
    wanted = entries(config, added_token_text(source))
    content.update({name: value for name, value in wanted.items() if name not in content})
    return [write_json_file(staging, PROCESSOR_FILE, content)]
